"""The sandbox's gateway daemon (``gateways.daemon`` of the sandbox's config): a stand-in for a
site's gateway daemon (ParaStation's psgwd in the DEEP systems) that a test can reach.

It listens on its node's loopback address (its name resolved: 127.0.0.N on a sandbox node) at ``--port`` and answers every connection with one line,
``tether-gateway <node> <job> <uid>``, then closes it; it ends on SIGTERM (what Slurm sends a
job's steps when the job ends). With ``SANDBOX_GATEWAY_FAIL`` in its environment (a job exports it)
it exits 3 before listening: how the tests make a daemon fail.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.sandbox.gateway_daemon")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node", default="")
    parser.add_argument("--bind", default=None, help="default: the node's own address (its name resolved), "
                        "when that is a loopback one, else 127.0.0.1")
    args = parser.parse_args(argv)
    if args.bind is None:             # a sandbox node has its own 127.0.0.N, its NodeAddr
        try:
            found = socket.gethostbyname(args.node) if args.node else ""
        except OSError:
            found = ""
        args.bind = found if found.startswith("127.") else "127.0.0.1"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if os.environ.get("SANDBOX_GATEWAY_FAIL"):
        print(f"gateway daemon on {args.node}: failing as SANDBOX_GATEWAY_FAIL asks", file=sys.stderr, flush=True)
        return 3
    with socket.create_server((args.bind, args.port)) as server:
        print(f"gateway daemon on {args.node}: listening on {args.bind}:{args.port}", flush=True)
        reply = f"tether-gateway {args.node} {os.environ.get('SLURM_JOB_ID', '')} {os.getuid()}\n".encode()
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    conn.sendall(reply)
                except OSError:
                    pass       # a client that closed at once


if __name__ == "__main__":
    sys.exit(main())

"""``tether sandbox`` and ``tether demo``: the local Slurm cluster for tests and demos.

tether.sandbox is imported when one of these runs (~80 ms of imports that other commands should
not pay; see cli/admin.py).
"""

from __future__ import annotations

import argparse

from .common import EXIT_FAIL, EXIT_OK, err


def sandbox(args: argparse.Namespace) -> int:
    from ..sandbox.cluster import Sandbox

    slurm = getattr(args, "slurm", None)
    box = Sandbox(args.dir, port_base=args.port_base, slurm=None if slurm is None else slurm.replace("host", ""),
                  nodes=getattr(args, "nodes", None), package=getattr(args, "package", None))
    if args.action == "env":
        print(box.export_line())
        return EXIT_OK
    if args.action == "install":
        box.install(log=err)
        return EXIT_OK
    if args.action == "up":
        quick = True if args.quick else (False if args.full else None)
        box.up(install=not args.no_install, quick=quick, log=err)
        print(box.export_line())
        return EXIT_OK
    if args.action == "down":
        if not box.down(purge=args.purge, log=err):
            err(f"no sandbox daemon was running at {box.root}")
        return EXIT_OK
    info = box.status()
    root = box.slurm_root
    print(f"sandbox {info['root']}" + (f" (Slurm {root.version()} in {root.path}: run Slurm's commands with "
                                       f"`chroot {root.path} ...`)" if root else ""))
    print(f"  {box.export_line()}")
    for name, pid in info["daemons"].items():
        print(f"  {name:<10} {'pid ' + str(pid) if pid else 'not running'}")
    for node, state in sorted(info["nodes"].items()):
        print(f"  node {node}: {state}")
    return EXIT_OK if all(info["daemons"].values()) else EXIT_FAIL


def demo(args: argparse.Namespace) -> int:
    from ..sandbox.cluster import Sandbox
    from ..sandbox.demo import run_demo

    return run_demo(Sandbox(args.dir, port_base=args.port_base), install=not args.no_install)


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    for name, helptext, func in (("sandbox", "the local Slurm cluster (3 nodes by default) for tests and demos", sandbox),
                                 ("demo", "bring up the sandbox and run the main multi-node job", demo)):
        p = sub.add_parser(name, parents=[common], help=helptext)
        if name == "sandbox":
            p.add_argument("action", choices=("install", "up", "status", "down", "env"),
                           help="install: the Debian packages and job user only; up: start (installs what is "
                                "missing); status; down: stop by PID; env: shell exports")
            p.add_argument("--purge", action="store_true", help="down: also remove the sandbox directory")
            size = p.add_mutually_exclusive_group()
            size.add_argument("--quick", action="store_true",
                              help="up: without the accounting database (slurmdbd, MariaDB) and cgroups")
            size.add_argument("--full", action="store_true",
                              help="up: with slurmdbd, MariaDB and cgroups (the default for a new sandbox; "
                                   "without either flag a sandbox starts as it last ran)")
        if name == "sandbox":
            p.add_argument("--nodes", type=int, metavar="N",
                           help="up: how many nodes (each a slurmd on this machine); 3 for a new sandbox, else as it "
                                "last ran")
            p.add_argument("--slurm", choices=("host", "24.11", "26.05"),
                           help="up: the Slurm release to run: the host's (Debian 12: 22.05), 24.11 (Debian 13) "
                                "or 26.05 (Debian testing) in a Debian root of its own that the first `up` builds "
                                "and caches; without it a sandbox starts as it last ran")
            p.add_argument("--package", metavar="DEB",
                           help="up, with --slurm 24.11 or 26.05: install tether in the root from this Debian "
                                "package, as an admin does (`tools/deb.py --slurm-release RELEASE` builds it); kept "
                                "across restarts. Without it (and none before) a root that has tether's package keeps "
                                "it; else tether is copied in")
        p.add_argument("--dir", metavar="DIR", help="sandbox root (default: $TETHER_SANDBOX_DIR, else "
                                                    "/var/lib/tether/sandbox)")
        p.add_argument("--port-base", type=int, metavar="PORT",
                       help="slurmctld port; the registries, slurmdbd and MariaDB use the next ones, slurmd "
                            "PORT+10 on (default 17000 or a free range)")
        p.add_argument("--no-install", action="store_true", help="do not apt-get missing packages")
        p.set_defaults(func=func)

"""``tether partition create|list|wait|stop|reconfig|run``: pilot partitions (docs/requirements.md,
"Pilot partitions"), inside an allocation; ``tether pilot submit|size``: a pilot job sized from its
initial partitions."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, err, read_yaml


def _pilot(job: str | None = None):
    from ..pilot import Pilot

    return Pilot(job=job)


def _show(parts) -> None:
    for part in parts:
        r = part.record
        cores = sum(c for c, _ in r["slice"].values())
        where = ",".join(r["slice"]) or "-"
        desc = r["description"]
        text = desc.get("size") or (f"{desc['nodes']} node(s)" if "nodes" in desc else f"{desc.get('cores')} cores")
        print(f"{r['id']:<10} {r['state']:<9} {text:<10} {where:<16} {cores:>3} cores  {r.get('message', '')}")


def _guard(action) -> int:
    from ..pilot import PartitionError, PilotError, StateError

    try:
        return action()
    except (PilotError, PartitionError, StateError) as exc:
        err(str(exc))
        return EXIT_FAIL
    except OSError as exc:                      # the pilot directory's files: a message, not a traceback
        err(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
        return EXIT_FAIL


def create(args: argparse.Namespace) -> int:
    return reconfig(argparse.Namespace(stop=None, start=args.descriptions, wait=args.wait, json=args.json))


def reconfig(args: argparse.Namespace) -> int:
    from ..pilot import ACTIVE, ALL, FAILED

    def act() -> int:
        pilot = _pilot()
        stop = None
        if args.stop:
            stop = ALL if ALL in args.stop else args.stop
        parts = pilot.reconfig(stop=stop, start=args.start or [])
        for warning in pilot.warnings:
            print(f"tether: warning: {warning}", file=sys.stderr)
        if args.wait:
            for part in parts:
                part.wait(ACTIVE, timeout=120)
        if args.json:
            print(json.dumps([p.record for p in parts]))
        else:
            _show(parts)
        return EXIT_FAIL if any(p.state == FAILED for p in parts) else EXIT_OK
    return _guard(act)


def list_(args: argparse.Namespace) -> int:
    from ..pilot import StateError

    def act() -> int:
        pilot = _pilot(args.job)
        pilot.recover()
        parts = pilot.partitions
        listed = {p.id for p in parts}
        for pid in pilot.store.partition_ids():       # a record that cannot be read: say which, and why
            if pid not in listed:
                try:
                    pilot.store.read(pid)
                except StateError as exc:
                    err(f"warning: {exc}")
        if args.json:
            print(json.dumps([p.record for p in parts]))
        else:
            _show(parts)
        return EXIT_OK
    return _guard(act)


def wait(args: argparse.Namespace) -> int:
    from ..pilot import ALL, FINAL

    def act() -> int:
        pilot = _pilot()
        if args.partition == ALL:                 # until every partition has ended
            deadline = None if args.timeout is None else time.monotonic() + args.timeout
            while any(p.state not in FINAL for p in pilot.partitions):
                if deadline is not None and time.monotonic() > deadline:
                    return EXIT_FAIL
                pilot.recover()
                time.sleep(2)
            _show(pilot.partitions)
            return EXIT_OK
        state = pilot.partition(args.partition).wait(args.state, timeout=args.timeout)
        print(state)
        return EXIT_OK if state == args.state else EXIT_FAIL
    return _guard(act)


def submit(args: argparse.Namespace) -> int:
    from ..hooks.errors import ConfigError
    from ..pilot import PartitionError
    from ..pilot.submit import submit_pilot

    try:
        job = submit_pilot(read_yaml(args.spec), scheduler=args.scheduler)
    except OSError as exc:
        err(f"cannot read {args.spec}: {exc.strerror}")
        return EXIT_USAGE
    except (ConfigError, PartitionError) as exc:
        err(str(exc))
        return EXIT_USAGE
    print(job)
    return EXIT_OK


def stop(args: argparse.Namespace) -> int:
    from ..pilot import ALL

    def act() -> int:
        pilot = _pilot()
        if args.partition == ALL:
            pilot.reconfig(stop=ALL, reason=args.reason)
        else:
            pilot.stop(args.partition, reason=args.reason)
        _show([pilot.partition(args.partition)] if args.partition != ALL else pilot.partitions)
        return EXIT_OK
    return _guard(act)


def run(args: argparse.Namespace) -> int:
    def act() -> int:
        command = args.cmd
        if not command:
            err("tether partition run PART -- COMMAND...: no command")
            return EXIT_USAGE
        task = _pilot().run(args.partition, command, ntasks=args.ntasks, wait=not args.no_wait)
        if args.no_wait:
            print(task.id)
            return EXIT_OK
        record = task.record
        sys.stdout.write(task.output)
        why = f" ({record['message']})" if record.get("message") and record["state"] != "DONE" else ""
        print(f"tether: {task.id} ran in partition {record['partition']} on {','.join(record['nodes']) or '-'}: "
              f"{record['state']}{why}", file=sys.stderr)
        code = record.get("exit_code")
        return 0 if record["state"] == "DONE" else (code if isinstance(code, int) and 0 < code < 256 else EXIT_FAIL)
    return _guard(act)


def size(args: argparse.Namespace) -> int:
    """The nodes a pilot needs for its initial partitions (docs/requirements.md, "Pilot partitions":
    the pilot's size follows from them, the agents' needs included)."""
    from ..pilot import Description, PartitionError
    from ..pilot.submit import pilot_nodes

    try:
        nodes = pilot_nodes([Description.parse(d) for d in args.descriptions], args.cores_per_node,
                            args.agent_cores)
    except PartitionError as exc:
        err(str(exc))
        return EXIT_USAGE
    print(f"--nodes={nodes}" if not args.json else json.dumps({"nodes": nodes}))
    return EXIT_OK


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    from ..pilot.state import STATES

    part = sub.add_parser("partition", help="pilot partitions: divide this allocation among agents")
    ps = part.add_subparsers(dest="action", required=True, metavar="ACTION")
    desc_help = "'1 node', '2 nodes', '16 cores', '50%%', FILL"
    p = ps.add_parser("create", parents=[common], help="create partitions, each with its agent step")
    p.add_argument("descriptions", nargs="+", metavar="DESCRIPTION", help=desc_help)
    p.add_argument("--wait", action="store_true", help="until each is ACTIVE (or failed)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=create)
    p = ps.add_parser("list", parents=[common], help="every partition of this pilot, ended ones too")
    p.add_argument("--json", action="store_true")
    p.add_argument("--job", metavar="JOBID", help="another pilot job's partitions, from outside it (once it has "
                                                  "ended, those not final are CANCELED)")
    p.set_defaults(func=list_)
    p = ps.add_parser("wait", parents=[common], help="wait for a partition's state (default ACTIVE); ALL: until "
                                                     "every partition has ended")
    p.add_argument("partition", metavar="PART|ALL")
    p.add_argument("--state", choices=STATES, default="ACTIVE")
    p.add_argument("--timeout", type=float, default=None)
    p.set_defaults(func=wait)
    p = ps.add_parser("stop", parents=[common], help="stop a partition (or ALL): its agent and tasks end")
    p.add_argument("partition", metavar="PART|ALL")
    p.add_argument("--reason", metavar="TEXT", help="the message the stopped partitions end with (default: "
                                                    "stopped)")
    p.set_defaults(func=stop)
    p = ps.add_parser("reconfig", parents=[common], help="stop partitions, then start others")
    p.add_argument("--stop", action="append", metavar="PART|ALL")
    p.add_argument("--start", action="append", metavar="DESCRIPTION", help=desc_help)
    p.add_argument("--wait", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=reconfig)
    p = ps.add_parser("run", parents=[common], usage="tether partition run PART [-n N] [--no-wait] -- COMMAND...",
                      help="run a task in a partition and wait for it")
    p.add_argument("partition", metavar="PART")
    p.add_argument("-n", "--ntasks", type=int, default=1)
    p.add_argument("--no-wait", action="store_true", help="print the task's id and return")
    p.set_defaults(cmd=[])                    # the words after --: tether.cli.main puts them here
    p.set_defaults(func=run)

    pilot = sub.add_parser("pilot", help="pilots: a job sized from its initial partitions")
    pls = pilot.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = pls.add_parser("submit", parents=[common], help="submit a pilot job sized from its initial partitions")
    p.add_argument("spec", metavar="PILOT.yaml")
    p.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm", help="sbatch (default) or qsub")
    p.set_defaults(func=submit)
    p = pls.add_parser("size", parents=[common], help="the --nodes a pilot needs for these initial partitions")
    p.add_argument("descriptions", nargs="+", metavar="DESCRIPTION", help="'1 node', '16 cores'")
    p.add_argument("--cores-per-node", type=int, required=True)
    p.add_argument("--agent-cores", type=int, default=0, help="each agent's own cores (its config's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=size)

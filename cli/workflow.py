"""``tether workflow submit|status|release|set-dependency``: workflow packs; ``tether gateway start``:
gateway nodes (docs/requirements.md, "Modular jobs")."""

from __future__ import annotations

import argparse
import json

from ..hooks.errors import ConfigError
from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, err, read_yaml


def submit(args: argparse.Namespace) -> int:
    from ..workflow import PackError, submit_pack

    source = "<stdin>" if args.pack == "-" else args.pack
    try:
        data = read_yaml(args.pack)
        result = submit_pack(data, scheduler=args.scheduler)
    except OSError as exc:
        err(f"cannot read pack {source}: {exc.strerror}")
        return EXIT_USAGE
    except (ConfigError, PackError) as exc:
        err(str(exc))
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result))
    else:
        print(f"pack {result['pack']}")
        for name, job in result["jobs"].items():
            print(f"  {name}: job {job}")
    return EXIT_OK


def status(args: argparse.Namespace) -> int:
    from ..workflow import PackError, pack_status

    try:
        rows = pack_status(args.pack, scheduler=args.scheduler)
    except PackError as exc:
        err(str(exc))
        return EXIT_FAIL
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK if rows else EXIT_FAIL
    if not rows:
        err(f"no pack {args.pack} among your jobs of the last 7 days (its id or its name: `tether workflow "
            f"submit` printed both)")
        return EXIT_FAIL
    several = len({r["pack"] for r in rows}) > 1
    for r in rows:
        print((f"{r['pack']:<20} " if several else "") + f"{r['job']:<16} {r['id']:<8} {r['state']:<10} "
              f"{r.get('dependency') or ''}")
    return EXIT_OK


def _change(args: argparse.Namespace, action) -> int:
    from ..workflow import PackError

    try:
        changed = action()
    except PackError as exc:
        err(str(exc))
        return EXIT_FAIL
    print(f"changed: {' '.join(changed)}" if changed else "no job of the pack waits on this one")
    return EXIT_OK


def release(args: argparse.Namespace) -> int:
    from ..workflow import release as run

    return _change(args, lambda: run(args.job))


def set_dependency(args: argparse.Namespace) -> int:
    from ..workflow import set_dependency as run

    return _change(args, lambda: run(args.type, args.job))


def gateway_start(args: argparse.Namespace) -> int:
    """In an allocation (salloc) with a gateway component: start the daemons as a batch script
    of such a job gets them, and print the variables (``eval "$(tether gateway start)"``)."""
    import os
    import shlex

    from ..container.gateways import GatewayError, gateway_component, start_gateways
    from ..hooks.configfile import load_config
    from .common import config_arg

    try:
        settings = load_config(config_arg(args)).data["gateways"]
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    component = gateway_component(os.environ, settings["partition"])
    if component is None:
        err("no component of this job is gateway nodes (run it inside an allocation of a heterogeneous job "
            "with a --gateways=N component)" if settings["partition"] else
            "this cluster has no gateway nodes (tether's configuration names no gateways.partition)")
        return EXIT_FAIL
    try:
        variables = start_gateways(os.environ, component, settings)
    except GatewayError as exc:
        err(str(exc))
        return EXIT_FAIL
    if args.json:
        print(json.dumps(variables))
    else:
        for name, value in variables.items():
            print(f"export {name}={shlex.quote(value)}")
    return EXIT_OK


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    from ..workflow.pack import DEPENDENCY_TYPES

    wf = sub.add_parser("workflow", help="workflow packs: jobs started with delays after the first one's start")
    wf_sub = wf.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = wf_sub.add_parser("submit", parents=[common], help="submit a pack (YAML) as yourself")
    p.add_argument("pack", metavar="PACK.yaml", help="the pack; - reads stdin")
    p.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=submit)
    p = wf_sub.add_parser("status", parents=[common], help="the pack's jobs and their states")
    p.add_argument("pack", metavar="PACK", help="the pack id tether workflow submit printed, or the pack's name")
    p.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=status)
    p = wf_sub.add_parser("release", parents=[common],
                          help="from a running job: make the pack's jobs that wait on it eligible now")
    p.add_argument("--job", metavar="ID", help="the job they wait on (default: $SLURM_JOB_ID)")
    p.set_defaults(func=release)
    p = wf_sub.add_parser("set-dependency", parents=[common],
                          help="change the dependency type of the pack's jobs that wait on this one")
    p.add_argument("--type", required=True, choices=DEPENDENCY_TYPES)
    p.add_argument("--job", metavar="ID", help="the job they wait on (default: $SLURM_JOB_ID)")
    p.set_defaults(func=set_dependency)
    gw = sub.add_parser("gateway", help="gateway nodes of a heterogeneous job (--gateways=N)")
    gw_sub = gw.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = gw_sub.add_parser("start", parents=[common],
                          help="in salloc: start the gateway daemons and print TETHER_GATEWAYS "
                               "(a batch script gets them without asking)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=gateway_start)

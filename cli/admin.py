"""``tether slurm build|install``, ``tether pbs install`` and ``tether doctor``: an admin's commands.

tether.admin is imported when one of these runs, not when ``tether`` starts: its builds pull in
cffi and the sandbox's dependencies, ~80 ms of imports (measured with ``python -X importtime``) that
every ``tether plan`` or ``tether run`` would otherwise pay.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..hooks.configfile import load_config
from .common import EXIT_FAIL, EXIT_OK, config_arg, err


def slurm(args: argparse.Namespace) -> int:
    from ..admin.slurm import build_plugins, install_plugins

    if args.action == "build":
        build_plugins(args.out, verbose=args.verbose, log=print)
    else:
        install_plugins(args.build_dir, slurm_conf=args.slurm_conf, plugin_dir=args.plugin_dir,
                        config=load_config(config_arg(args)), write=args.write, log=print)
    return EXIT_OK


def doctor(args: argparse.Namespace) -> int:
    """One line per check of this host's setup; exit 1 when any failed."""
    from ..admin.doctor import doctor as run_doctor

    return run_doctor(config_arg(args), args.slurm_conf, tuple(args.user or ()), log=print)


def pbs(args: argparse.Namespace) -> int:
    from ..admin.pbs import install

    config = load_config(config_arg(args))                 # refuse to install a broken config
    install(config, hook_dir=Path(args.hook_dir), libexec=Path(args.libexec), apply=args.apply, log=print)
    return EXIT_OK


def pbs_status(args: argparse.Namespace) -> int:
    """One line per job: state, queue, what tether planned (select/place) and its notes."""
    from ..pbs_hooks.commands import PBSCommandError, job_status

    try:
        jobs = job_status(args.jobs, history=args.history)
    except PBSCommandError as exc:
        err(str(exc))
        return EXIT_FAIL
    for job in jobs.values():
        res = job.resources
        planned = " ".join(f"{k}={res[k]}" for k in ("select", "place") if k in res)
        slots = " ".join(f"{k}={v}" for k, v in res.items() if str(k).startswith("tether_"))
        exit_status = "" if job.exit_status is None else f" exit={job.exit_status}"
        print(f"{job.job_id} {job.state} queue={job.queue} {planned} {slots}{exit_status}"
              + (f"  # {job.comment}" if job.comment else ""))
    return EXIT_OK


def pbs_nodes(args: argparse.Namespace) -> int:
    """One line per node: usable or not, its states, GPUs, jobs."""
    from ..pbs_hooks.commands import PBSCommandError, node_status

    try:
        nodes = node_status()
    except PBSCommandError as exc:
        err(str(exc))
        return EXIT_FAIL
    for node in nodes.values():
        print(f"{node.name} {'usable' if node.usable else 'unusable'} state={','.join(node.states)} "
              f"ngpus={node.gpus} jobs={','.join(node.jobs) or '-'}")
    return EXIT_OK


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("slurm", help="build and install the Slurm plugins (SPANK and job_submit)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="compile both plugins against the installed Slurm headers")
    build.add_argument("--out", metavar="DIR", help="output directory (default /opt/tether/lib/slurm-<version>)")
    build.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    build.set_defaults(func=slurm)
    inst = actions.add_parser("install", parents=[common],
                              help="print what installing the plugins takes (--write: do it)")
    inst.add_argument("--build-dir", metavar="DIR",
                      help="what `tether slurm build` produced (default /opt/tether/lib/slurm-<version>)")
    inst.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf (default $SLURM_CONF, else /etc/slurm/slurm.conf)")
    inst.add_argument("--plugin-dir", metavar="DIR",
                      help="where the .so files go (default: the last directory of slurm.conf's PluginDir)")
    inst.add_argument("--write", action="store_true",
                      help="install the plugins and the launcher, edit slurm.conf and plugstack.conf")
    inst.set_defaults(func=slurm)

    p = sub.add_parser("doctor", parents=[common],
                       help="check this host's setup (Slurm and plugins, plugstack.conf and slurm.conf, the "
                            "config slurmctld reads, runtimes, job users' subuid, CDI, storage); exit 1 on a failure")
    p.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf (default $SLURM_CONF, else /etc/slurm/slurm.conf)")
    p.add_argument("--user", action="append", metavar="NAME",
                   help="a job user to check rootless podman's needs for (repeatable)")
    p.set_defaults(func=doctor)

    p = sub.add_parser("pbs", help="install tether's PBS hooks")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    inst = actions.add_parser("install", parents=[common],
                              help="print what installing the hooks takes on this host (--apply: do it)")
    inst.add_argument("--hook-dir", metavar="DIR", default="/etc/tether",
                      help="where the hooks' JSON configs go (default /etc/tether)")
    inst.add_argument("--libexec", metavar="DIR", default="/opt/tether/libexec",
                      help="where tether-jobdirs and the container launcher go (default /opt/tether/libexec)")
    inst.add_argument("--apply", action="store_true",
                      help="build and write this host's files and run the qmgr commands")
    inst.set_defaults(func=pbs)
    status = actions.add_parser("status", parents=[common],
                                help="PBS jobs as tether planned them (qstat -f -F json): state, select, place")
    status.add_argument("--history", action="store_true", help="include finished jobs (qstat -x)")
    status.add_argument("jobs", nargs="*", metavar="JOB", help="job ids (default: every job you can see)")
    status.set_defaults(func=pbs_status)
    actions.add_parser("nodes", parents=[common], help="PBS nodes (pbsnodes -a -F json): usable, GPUs, jobs") \
        .set_defaults(func=pbs_nodes)

"""The ``tether`` command: one console script with subcommands.

The modules behind the admin subcommands (the sandbox, the builds) are imported when one runs, not
at start: ``tether plan`` and ``tether run`` should not pay for them (measured: importing the
sandbox and admin modules adds ~40 ms, jinja2 most of it).
Exit codes: 0 success, 1 a failure (bad config, a command that failed), 2 a usage error or an
invalid job request (what sbatch/qsub would refuse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from ..container.images import ImageCache
from ..container.run import container_settings, run_container
from ..hooks.config import config_reference
from ..hooks.configfile import dump_yaml, load_config, load_yaml
from ..hooks.errors import ConfigError, RequestError, TetherError
from ..hooks.header import batch_header
from ..hooks.plan import make_plan
from ..hooks.render import option_words, script_directives, script_options
from ..hooks.request import request_from_spec
from ..hooks.surface import CONTAINER_OPTIONS

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _err(message: str) -> None:
    for line in str(message).splitlines() or [""]:
        print(f"tether: {line}", file=sys.stderr)


def _config_arg(args: argparse.Namespace) -> str | None:
    """--config may be given before or after the subcommand (it is absent when not given)."""
    return getattr(args, "config", None)


def _cmd_config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file or _config_arg(args))
    except ConfigError as exc:
        print(str(exc))
        return EXIT_FAIL
    print(f"ok ({config.source})")
    return EXIT_OK


def _cmd_config_show(args: argparse.Namespace) -> int:
    config = load_config(_config_arg(args))
    print(f"# effective tether configuration from {config.source}")
    sys.stdout.write(dump_yaml(config))
    return EXIT_OK


def _cmd_config_reference(args: argparse.Namespace) -> int:
    sys.stdout.write(config_reference())
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    config = load_config(_config_arg(args))
    source = "<stdin>" if args.spec == "-" else args.spec
    try:
        text = sys.stdin.read() if args.spec == "-" else open(args.spec, encoding="utf-8").read()
    except OSError as exc:
        _err(f"cannot read job spec {source}: {exc.strerror}")
        return EXIT_USAGE
    try:
        spec = load_yaml(text, source)
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    try:
        request = request_from_spec(spec, args.scheduler, source)
        plan = make_plan(request, config, args.scheduler)
        header = batch_header(request, args.log_dir)
        directives = script_directives(plan, header)
    except RequestError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if args.format == "json":
        print(json.dumps({"directives": directives,
                          "args": option_words(script_options(plan, header), plan.scheduler),
                          "plan": plan.to_dict()}, indent=2))
        return EXIT_OK
    for notice in plan.notices:
        _err(f"note: {notice}")
    print("\n".join(directives))
    return EXIT_OK


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from ..sandbox.cluster import Sandbox

    box = Sandbox(args.dir, port_base=args.port_base)
    if args.action == "env":
        print(box.export_line())
        return EXIT_OK
    if args.action == "install":
        box.install(log=lambda m: _err(m))
        return EXIT_OK
    if args.action == "up":
        box.up(install=not args.no_install, log=lambda m: _err(m))
        print(box.export_line())
        return EXIT_OK
    if args.action == "down":
        stopped = box.down(purge=args.purge, log=lambda m: _err(m))
        if not stopped:
            _err(f"no sandbox daemon was running at {box.root}")
        return EXIT_OK
    info = box.status()
    print(f"sandbox {info['root']}")
    print(f"  {box.export_line()}")
    for name, pid in info["daemons"].items():
        print(f"  {name:<10} {'pid ' + str(pid) if pid else 'not running'}")
    for node, state in sorted(info["nodes"].items()):
        print(f"  node {node}: {state}")
    return EXIT_OK if all(info["daemons"].values()) else EXIT_FAIL


def _cmd_slurm(args: argparse.Namespace) -> int:
    from ..admin.slurm import build_plugins, install_plugins

    log = lambda m: print(m)  # noqa: E731
    if args.action == "build":
        build_plugins(args.out, verbose=args.verbose, log=log)
    else:
        install_plugins(args.build_dir, slurm_conf=args.slurm_conf, plugin_dir=args.plugin_dir,
                        config=load_config(_config_arg(args)), write=args.write, log=log)
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        _err("tether run: give the command to run in the container after --")
        return EXIT_USAGE
    env = dict(os.environ)
    for opt in CONTAINER_OPTIONS:                 # the srun/sbatch options, the same TETHER_* variables
        value = getattr(args, opt.name.replace("-", "_"))
        if value is True:
            env[opt.env] = "1"
        elif value:
            env[opt.env] = value
    run_container(env, command, container_settings(_config_arg(args)))


def _cmd_images(args: argparse.Namespace) -> int:
    cache = ImageCache(load_config(_config_arg(args)).data["container"]["apptainer_image_root"])
    if args.action == "ls":
        print(f"{'SIZE':>10}  {'LAST USED':<16}  {'OWNER':>6}  SOURCE  PATH")
        for image in cache.entries():
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(image.last_used))
            print(f"{image.size:>10}  {used:<16}  {image.owner:>6}  {image.source}  {image.path}")
        return EXIT_OK
    for path in cache.prune(args.older_than):
        print(f"removed {path}")
    return EXIT_OK


def _cmd_pbs(args: argparse.Namespace) -> int:
    from ..admin.pbs import install

    config = load_config(_config_arg(args))                 # refuse to install a broken config
    install(config, hook_dir=Path(args.hook_dir), libexec=Path(args.libexec), apply=args.apply, log=print)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..sandbox.cluster import Sandbox
    from ..sandbox.demo import run_demo

    return run_demo(Sandbox(args.dir, port_base=args.port_base), install=not args.no_install)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="configuration file (default: $TETHER_CONFIG, else /etc/tether/tether.yaml)")
    parser = argparse.ArgumentParser(prog="tether", parents=[common],
                                     description="Slurm/PBS plugin and hook bundle: slots to resources, "
                                                 "per-rank setup, tightly integrated containers.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="check or show the configuration")
    config_sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", parents=[common], help="validate a config file; prints ok or every error")
    check.add_argument("file", nargs="?", metavar="FILE", help="file to check (default: the effective config)")
    check.set_defaults(func=_cmd_config_check)
    show = config_sub.add_parser("show", parents=[common], help="print the effective config with defaults")
    show.set_defaults(func=_cmd_config_show)
    reference = config_sub.add_parser("reference", help="print every config key as a Markdown table")
    reference.set_defaults(func=_cmd_config_reference)

    plan = sub.add_parser("plan", parents=[common],
                          help="print the batch-script directives tether generates for a job spec")
    plan.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm")
    plan.add_argument("--format", choices=("text", "json"), default="text")
    plan.add_argument("--log-dir", metavar="DIR",
                      help="where the job's output and error logs go (default: <job name>.out and .err in "
                           "the directory the script is submitted from)")
    plan.add_argument("spec", metavar="SPEC.yaml", help="job spec (YAML); - reads stdin")
    plan.set_defaults(func=_cmd_plan)

    slurm = sub.add_parser("slurm", help="build and install the Slurm plugins (SPANK and job_submit)")
    slurm_sub = slurm.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = slurm_sub.add_parser("build", help="compile both plugins against the installed Slurm headers")
    build.add_argument("--out", metavar="DIR", help="output directory (default /opt/tether/lib/slurm-<version>)")
    build.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    build.set_defaults(func=_cmd_slurm)
    inst = slurm_sub.add_parser("install", parents=[common],
                                help="install the plugins; print (or --write) the config lines")
    inst.add_argument("--build-dir", metavar="DIR", help="what `tether slurm build` produced (default "
                                                         "/opt/tether/lib/slurm-<version>)")
    inst.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf (default $SLURM_CONF, else "
                                                           "/etc/slurm/slurm.conf)")
    inst.add_argument("--plugin-dir", metavar="DIR", help="where the .so files go (default: the last "
                                                          "directory of slurm.conf's PluginDir)")
    inst.add_argument("--write", action="store_true", help="edit slurm.conf and plugstack.conf")
    inst.set_defaults(func=_cmd_slurm)

    run = sub.add_parser("run", parents=[common],
                         help="run a command in a container as tether's SPANK plugin and PBS hooks do "
                              "(options default to the TETHER_CONTAINER_* variables)")
    for opt in CONTAINER_OPTIONS:
        if opt.kind == "flag":
            run.add_argument(opt.flag, action="store_true", help=f"{opt.usage}; environment ${opt.env}")
        else:
            run.add_argument(opt.flag, metavar=opt.arginfo, help=f"{opt.usage}; environment ${opt.env}")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    run.set_defaults(func=_cmd_run)

    images = sub.add_parser("images", help="the Apptainer/Singularity image cache")
    images_sub = images.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = images_sub.add_parser("ls", parents=[common], help="list the converted images you can use")
    ls.set_defaults(func=_cmd_images)
    prune = images_sub.add_parser("prune", parents=[common],
                                  help="remove images unused for DAYS (yours; all as root) and "
                                       "leftovers of failed conversions")
    prune.add_argument("--older-than", type=float, default=30.0, metavar="DAYS")
    prune.set_defaults(func=_cmd_images)

    pbs_cmd = sub.add_parser("pbs", help="install tether's PBS hooks")
    pbs_sub = pbs_cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    pbs_install = pbs_sub.add_parser("install", parents=[common],
                                     help="this host's helper, launcher and hook configs; print (or "
                                          "--apply) the qmgr commands")
    pbs_install.add_argument("--hook-dir", metavar="DIR", default="/etc/tether",
                             help="where the hooks' JSON configs go (default /etc/tether)")
    pbs_install.add_argument("--libexec", metavar="DIR", default="/opt/tether/libexec",
                             help="where tether-jobdirs and the container launcher go (default "
                                  "/opt/tether/libexec)")
    pbs_install.add_argument("--apply", action="store_true", help="run the qmgr commands")
    pbs_install.set_defaults(func=_cmd_pbs)

    for name, helptext, func in (("sandbox", "the local 3-node Slurm cluster for tests and demos", _cmd_sandbox),
                                 ("demo", "bring up the sandbox and run the main multi-node job", _cmd_demo)):
        p = sub.add_parser(name, parents=[common], help=helptext)
        if name == "sandbox":
            p.add_argument("action", choices=("install", "up", "status", "down", "env"),
                           help="install: the Debian packages and job user only; up: start (installs "
                                "what is missing); status; down: stop by PID; env: shell exports")
            p.add_argument("--purge", action="store_true", help="down: also remove the sandbox directory")
        p.add_argument("--dir", metavar="DIR", help="sandbox root (default: $TETHER_SANDBOX_DIR, "
                                                    "else /var/lib/tether/sandbox)")
        p.add_argument("--port-base", type=int, metavar="PORT",
                       help="slurmctld port; slurmd use the next three (default 17000 or a free range)")
        p.add_argument("--no-install", action="store_true", help="do not apt-get missing packages")
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TetherError as exc:
        _err(str(exc))
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                       # `tether … | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

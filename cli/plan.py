"""``tether plan`` and ``tether config``: what tether asks the scheduler for, and its configuration."""

from __future__ import annotations

import argparse
import json
import sys

from ..hooks.config import config_reference
from ..hooks.configfile import dump_yaml, load_config, load_yaml
from ..hooks.errors import ConfigError, RequestError
from ..hooks.header import batch_header
from ..hooks.plan import make_plan
from ..hooks.render import option_words, script_directives, script_options
from ..hooks.request import request_from_spec
from ..hooks.surface import CONTAINER_OPTIONS
from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config_arg, err


def config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file or config_arg(args))
    except ConfigError as exc:
        print(str(exc))
        return EXIT_FAIL
    print(f"ok ({config.source})")
    return EXIT_OK


def config_show(args: argparse.Namespace) -> int:
    config = load_config(config_arg(args))
    print(f"# effective tether configuration from {config.source}")
    sys.stdout.write(dump_yaml(config))
    return EXIT_OK


def config_reference_cmd(args: argparse.Namespace) -> int:
    sys.stdout.write(config_reference())
    return EXIT_OK


def plan(args: argparse.Namespace) -> int:
    config = load_config(config_arg(args))
    source = "<stdin>" if args.spec == "-" else args.spec
    try:
        text = sys.stdin.read() if args.spec == "-" else open(args.spec, encoding="utf-8").read()
    except OSError as exc:
        err(f"cannot read job spec {source}: {exc.strerror}")
        return EXIT_USAGE
    try:
        spec = load_yaml(text, source)
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    try:
        request = request_from_spec(spec, args.scheduler, source)
        planned = make_plan(request, config, args.scheduler)
        header = batch_header(request, args.log_dir)
        directives = script_directives(planned, header)
    except RequestError as exc:
        err(str(exc))
        return EXIT_USAGE
    command = list(args.cmd)                     # the words after `--` (tether.cli.main)
    if command:                                  # a whole batch script: directives and the launch body
        return _batch_script(args, planned, directives, command, config)
    if args.format == "json":
        print(json.dumps({"directives": directives,
                          "args": option_words(script_options(planned, header), planned.scheduler),
                          "plan": planned.to_dict()}, indent=2))
        return EXIT_OK
    for notice in planned.notices:
        err(f"note: {notice}")
    print("\n".join(directives))
    return EXIT_OK


def _batch_script(args: argparse.Namespace, planned, directives: list[str], command: list[str], config) -> int:
    """Print a complete batch script: the directives, then one container per node running
    ``command`` (docs/requirements.md, "One container per node": srun with one task per node; PBS:
    pbs_tmrsh per host), through
    ``tether run`` with the --container-* options given here."""
    from ..container.scripts import compose_batch_script, pbs_launch_script, slurm_launch_script
    from ..container.spec import LaunchError
    from ..hooks.surface import CONTAINER_OPTIONS

    options = {}
    for opt in CONTAINER_OPTIONS:
        value = getattr(args, opt.name.replace("-", "_"), None)
        if value:
            options[opt.name] = "1" if value is True else value
    if "container-image" not in options:
        err("tether plan: a batch script with a command needs --container-image (one container per node)")
        return EXIT_USAGE
    render = pbs_launch_script if planned.scheduler == "pbs" else slurm_launch_script
    try:
        body = render(command, options, {}, tether=args.tether,
                      default_runtime=config.data["container"]["runtime"])
    except LaunchError as exc:
        err(str(exc))
        return EXIT_USAGE
    for notice in planned.notices:
        err(f"note: {notice}")
    sys.stdout.write(compose_batch_script(directives, body))
    return EXIT_OK


def _add_container_options(p: argparse.ArgumentParser) -> None:
    for opt in CONTAINER_OPTIONS:                # with -- COMMAND: the containers of the batch script
        if opt.kind == "flag":
            p.add_argument(opt.flag, action="store_true", help=f"with a command: {opt.usage}")
        else:
            p.add_argument(opt.flag, metavar=opt.arginfo, help=f"with a command: {opt.usage}")
    p.add_argument("--tether", default="tether", metavar="PATH",
                   help="with a command: the tether command on the compute nodes (default: tether)")


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    config = sub.add_parser("config", help="check or show the configuration")
    config_sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", parents=[common], help="validate a config file; prints ok or every error")
    check.add_argument("file", nargs="?", metavar="FILE", help="file to check (default: the effective config)")
    check.set_defaults(func=config_check)
    config_sub.add_parser("show", parents=[common], help="print the effective config with defaults") \
        .set_defaults(func=config_show)
    config_sub.add_parser("reference", help="print every config key as a Markdown table") \
        .set_defaults(func=config_reference_cmd)

    p = sub.add_parser("plan", parents=[common], usage="tether plan [options] SPEC.yaml [-- COMMAND [ARG...]]",
                       help="print the batch-script directives tether generates for a job spec; with -- "
                            "COMMAND, a whole batch script running COMMAND in one container per node")
    p.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--log-dir", metavar="DIR",
                   help="where the job's output and error logs go (default: <job name>.out and .err in the "
                        "directory the script is submitted from)")
    p.add_argument("spec", metavar="SPEC.yaml", help="job spec (YAML); - reads stdin")
    _add_container_options(p)
    # `-- COMMAND [ARG...]` after everything else: a whole batch script that runs COMMAND in one
    # container per node (split off before argparse: tether.cli.main)
    p.set_defaults(func=plan, cmd=[])

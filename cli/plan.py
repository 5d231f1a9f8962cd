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
    if args.format == "json":
        print(json.dumps({"directives": directives,
                          "args": option_words(script_options(planned, header), planned.scheduler),
                          "plan": planned.to_dict()}, indent=2))
        return EXIT_OK
    for notice in planned.notices:
        err(f"note: {notice}")
    print("\n".join(directives))
    return EXIT_OK


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

    p = sub.add_parser("plan", parents=[common], help="print the batch-script directives tether generates for a job spec")
    p.add_argument("--scheduler", choices=("slurm", "pbs"), default="slurm")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--log-dir", metavar="DIR",
                   help="where the job's output and error logs go (default: <job name>.out and .err in the "
                        "directory the script is submitted from)")
    p.add_argument("spec", metavar="SPEC.yaml", help="job spec (YAML); - reads stdin")
    p.set_defaults(func=plan)

"""The ``tether`` command: one console script; each command group is a module of this package.

Exit codes: 0 success, 1 a failure (bad config, a command that failed), 2 a usage error or an
invalid job request (what sbatch/qsub would refuse).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..hooks.errors import TetherError
from . import admin, containers, launcher, pilot, plan, sandbox, workflow
from .common import EXIT_FAIL, EXIT_OK, common_parser, err

COMMAND_GROUPS = (plan, containers, launcher, workflow, pilot, admin, sandbox)


def tether_version() -> str:
    # imported here: importlib.metadata and the lookup were about half of every tether command's start
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tether")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class _VersionAction(argparse.Action):
    """argparse's ``version`` action, with the version looked up only when ``--version`` is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(f"tether {tether_version()}\n", sys.stdout)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(prog="tether", parents=[common],
                                     description="Slurm/PBS plugin and hook bundle: slots to resources, "
                                                 "per-rank setup, tightly integrated containers.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_parsers(sub, common)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``tether plan … -- COMMAND…`` and ``tether partition run … -- COMMAND…``: the words after
    ``--`` are the command (options may follow SPEC.yaml or PART, so argparse's REMAINDER cannot
    take them)."""
    words = [i for i, w in enumerate(argv) if not w.startswith("-") and (i == 0 or argv[i - 1] != "--config")]
    if not words or "--" not in argv[words[0]:]:
        return argv, None
    if argv[words[0]] != "plan" and not (argv[words[0]] == "partition" and len(words) > 1
                                         and argv[words[1]] == "run"):
        return argv, None
    cut = argv.index("--", words[0])
    return argv[:cut], argv[cut + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    argv, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    if command is not None:
        args.cmd = command
    try:
        return args.func(args)
    except TetherError as exc:
        err(str(exc))
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                       # `tether … | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""What every ``tether`` subcommand shares: exit codes, messages, the ``--config`` option."""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def err(message: str) -> None:
    """``tether: <line>`` on stderr for each line of ``message``."""
    for line in str(message).splitlines() or [""]:
        print(f"tether: {line}", file=sys.stderr)


def read_yaml(path: str):
    """A YAML document from ``path`` ("-": stdin), as tether's config loader reads it (OSError when
    the file cannot be read, ConfigError when it is not YAML)."""
    from ..hooks.configfile import load_yaml

    if path == "-":
        return load_yaml(sys.stdin.read(), "<stdin>")
    with open(path, encoding="utf-8") as fh:
        return load_yaml(fh.read(), path)


def config_arg(args: argparse.Namespace) -> str | None:
    """--config may be given before or after the subcommand (it is absent when not given)."""
    return getattr(args, "config", None)


def common_parser() -> argparse.ArgumentParser:
    """The options every subcommand takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="configuration file (default: $TETHER_CONFIG, else /etc/tether/tether.yaml)")
    return common

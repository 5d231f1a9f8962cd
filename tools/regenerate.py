"""Regenerate what is derived from tether's tables (run by `make generated`; the tests check that
the committed copies are current): native/tether_names.h, the README's marked tables and the manual
pages in docs/man."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tether.cli.manpages import pages
from tether.cli.main import tether_version
from tether.container.environment import contract_table
from tether.hooks.config import config_reference
from tether.hooks.surface import options_reference, rank_env_reference
from tether.native.build import names_header

REPO = Path(__file__).resolve().parent.parent
README_TABLES = {"config-reference": config_reference, "options-reference": options_reference,
                 "container-env": contract_table, "rank-env": rank_env_reference}


def readme_with_tables(text: str) -> str:
    """``text`` (the README) with every marked table replaced by its current rendering."""
    for name, render in README_TABLES.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- {name}:start/end --> markers")
        text = pattern.sub(lambda m: m.group(1) + render() + m.group(2), text)
    return text


def main() -> int:
    (REPO / "native" / "tether_names.h").write_text(names_header())
    readme = REPO / "README.md"
    readme.write_text(readme_with_tables(readme.read_text()))
    (REPO / "docs" / "man").mkdir(exist_ok=True)
    for name, text in pages(tether_version()).items():
        (REPO / "docs" / "man" / name).write_text(text)
    print("regenerated native/tether_names.h, README.md's tables and docs/man", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Names that do not exist fail here, not in a daemon: pyflakes over every Python file of the
product (a name used where no import or assignment made it raised NameError only when that line
ran -- the launcher's sudo path did, in tether serve, for every request)."""

from __future__ import annotations

import subprocess

from pyflakes import api, messages

from helpers import REPO

UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    """A pyflakes reporter keeping what it is told."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def unexpectedError(self, filename, message) -> None:
        self.found.append(f"{filename}: {message}")

    def syntaxError(self, filename, message, lineno, offset, text) -> None:
        self.found.append(f"{filename}:{lineno}: {message}")

    def flake(self, message) -> None:
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))


def test_no_product_module_uses_a_name_nothing_defines():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    product = [REPO / f for f in files if not f.startswith("tests/")]
    assert len(product) > 100, "the file list came back short"
    seen = _Collect()
    for path in product:
        api.checkPath(str(path), seen)
    assert seen.found == [], "\n".join(seen.found)


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (no packages under tests/): two files of one
    name in different directories stop the whole run at collection ("import file mismatch")."""
    files = subprocess.run(["git", "ls-files", "tests/*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    names = [f.rsplit("/", 1)[-1] for f in files if f.rsplit("/", 1)[-1].startswith("test_")]
    assert len(names) > 50 and sorted({n for n in names if names.count(n) > 1}) == []

"""The manual pages (issue 41): generated from the tables the code uses, committed in docs/man,
kept equal to what `make generated` writes, and rendered by man without a warning."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tether.cli.manpages import PAGES, pages, roff
from tether.cli.main import tether_version
from tether.hooks.config import CONFIG_SCHEMA, Struct, walk_keys
from tether.hooks.surface import OPTIONS

MAN = Path(__file__).resolve().parents[2] / "docs" / "man"


def test_the_committed_pages_are_what_make_generated_writes():
    generated = pages(tether_version())
    assert sorted(generated) == sorted(PAGES) == sorted(p.name for p in MAN.iterdir())
    for name, text in generated.items():
        assert (MAN / name).read_text() == text, f"docs/man/{name} is stale: run `make generated`"


@pytest.mark.parametrize("name", PAGES)
def test_each_page_renders_without_a_warning(name):
    result = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN / name)], capture_output=True,
                            text=True, timeout=60, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_every_option_and_every_config_key_has_its_entry():
    spank, conf = (MAN / "tether-spank.8").read_text(), (MAN / "tether.yaml.5").read_text()
    for opt in OPTIONS:
        assert f"\\fB{roff(opt.flag)}\\fR" in spank and roff(opt.env) in spank, opt
    for path, node in walk_keys(CONFIG_SCHEMA):
        if not isinstance(node, Struct):
            assert f".B {roff(path)}\n" in conf, path


def test_roff_escapes_what_would_be_read_as_requests():
    assert roff(".x and 'y\n.z") == "\\&.x and 'y\n\\&.z"
    assert roff("a\\b --c `d`") == "a\\eb \\-\\-c \\fBd\\fR"

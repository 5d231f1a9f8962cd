"""tether's pytest plugin (entry point ``tether.testing``): the fixtures tether.testing describes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .pbs import FakePbs, pbs_module
from .runtimes import FakeRuntimes
from .slurm import FakeSlurm


@pytest.fixture
def tether_site_config(request) -> Path | None:
    """The tether.yaml under test, the test's own first: the one beside the test file, else the
    one in pytest's root directory, else $TETHER_CONFIG (a shell's, which must not override what
    the test directory holds), else None (tether's defaults)."""
    for candidate in (Path(str(request.path)).parent / "tether.yaml", Path(str(request.config.rootpath)) / "tether.yaml"):
        if candidate.exists():
            return candidate
    return Path(os.environ["TETHER_CONFIG"]) if os.environ.get("TETHER_CONFIG") else None


@pytest.fixture
def fake_slurm(request, tmp_path_factory, tether_site_config) -> FakeSlurm:
    """The fake Slurm; with ``fake_runtimes`` in the same test, its commands are on the jobs' PATH."""
    return _with_runtimes(request, FakeSlurm(tmp_path_factory.mktemp("fake-slurm"), config=tether_site_config))


@pytest.fixture
def fake_pbs(request, tmp_path_factory, tether_site_config) -> FakePbs:
    """The fake OpenPBS; with ``fake_runtimes`` in the same test, its commands are on the jobs' PATH."""
    return _with_runtimes(request, FakePbs(tmp_path_factory.mktemp("fake-pbs"), config=tether_site_config))


def _with_runtimes(request, fakes):
    """``fakes`` composed with the test's fake runtimes, when it asked for them: their bin directory
    follows the scheduler's on the PATH its commands and jobs get."""
    if "fake_runtimes" in request.fixturenames:
        fakes.also_on_path.append(request.getfixturevalue("fake_runtimes").bin_dir)
    return fakes


@pytest.fixture
def fake_runtimes(tmp_path_factory) -> FakeRuntimes:
    return FakeRuntimes(tmp_path_factory.mktemp("fake-runtimes"))


@pytest.fixture
def pbs_stub():
    return pbs_module()

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
    """The site's tether.yaml: $TETHER_CONFIG, else tether.yaml in pytest's root directory."""
    if os.environ.get("TETHER_CONFIG"):
        return Path(os.environ["TETHER_CONFIG"])
    candidate = Path(str(request.config.rootpath)) / "tether.yaml"
    return candidate if candidate.exists() else None


@pytest.fixture
def fake_slurm(tmp_path_factory, tether_site_config) -> FakeSlurm:
    return FakeSlurm(tmp_path_factory.mktemp("fake-slurm"), config=tether_site_config)


@pytest.fixture
def fake_pbs(tmp_path_factory, tether_site_config) -> FakePbs:
    return FakePbs(tmp_path_factory.mktemp("fake-pbs"), config=tether_site_config)


@pytest.fixture
def fake_runtimes(tmp_path_factory) -> FakeRuntimes:
    return FakeRuntimes(tmp_path_factory.mktemp("fake-runtimes"))


@pytest.fixture
def pbs_stub():
    return pbs_module()

"""Fixtures of the container tests: the podman and enroot default stores under each test's tmp_path
(every test here), the fake Apptainer, a runtime config.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _podman_store_in_tmp(tmp_path, monkeypatch):
    """The podman adapter's default store, made by each launch, goes under the test's tmp_path."""
    monkeypatch.setattr("tether.container.runtimes.podman.DEFAULT_STORE", str(tmp_path / "podman-store-{uid}"))
    monkeypatch.setattr("tether.container.runtimes.enroot.DEFAULT_STORE", str(tmp_path / "enroot-store-{uid}"))


@pytest.fixture
def fp_quick(fp, monkeypatch):
    """pytest-subprocess's ``fp``, faking the rank launcher's commands too: ``run_quick`` (which
    spawns without the subprocess module that ``fp`` patches) goes through ``run_command`` here.
    run_quick's own behaviour is tested against real processes (tests/unit/test_proc.py)."""
    from tether.system import proc

    monkeypatch.setattr(proc, "run_quick", lambda argv, *, env=None, timeout=proc.DEFAULT_TIMEOUT, check=True:
                        proc.run_command(argv, env=env, timeout=timeout, check=check))
    return fp


@pytest.fixture
def runtime_config(tmp_path):
    config = tmp_path / "tether.yaml"
    config.write_text(f"container: {{apptainer_image_root: {tmp_path / 'images'}, "
                      f"enroot: {{store: '{tmp_path}/enroot-{{uid}}'}}, podman: {{store: '{tmp_path}/podman-{{uid}}'}}}}\n")
    return config

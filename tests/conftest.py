"""Shared fixtures: the hypothesis profiles, and the real local Slurm cluster for the cluster level.

The cluster (slurmctld + 3 slurmd + munge, see tether.sandbox.cluster) starts once per session in
its own directory and on free ports, so it never collides with a sandbox a developer started.
A cluster that cannot start fails the tests that need it; it never skips them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from helpers import TEST_SANDBOX_2411_ROOT, TEST_SANDBOX_ROOT, Cluster
from tether.sandbox.cluster import Sandbox, SandboxError

# Hypothesis: `ci` keeps the unit level fast; `thorough` is what the properties were first run with.
settings.register_profile("ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

@pytest.fixture
def public_dir():
    """A directory other users can reach (pytest's tmp_path is under a root-only 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="tether-test-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_cluster_error: list[str] = []


@pytest.fixture(scope="session")
def cluster():
    """Start the sandbox once for the session; fail (never skip) when it cannot start."""
    if _cluster_error:
        pytest.fail(_cluster_error[0], pytrace=False)
    box = Sandbox(TEST_SANDBOX_ROOT)
    try:
        box.up(install=False, log=lambda m: None)
    except SandboxError as exc:
        _cluster_error.append(f"the sandbox cluster did not start:\n{exc}")
        pytest.fail(_cluster_error[0], pytrace=False)
    yield Cluster(box)
    box.down(log=lambda m: None)


_cluster_2411_error: list[str] = []


@pytest.fixture(scope="session")
def cluster_2411():
    """The same sandbox on Slurm 24.11 (its Debian 13 root is built once and cached, about a
    minute); fails, never skips, when it cannot start."""
    if _cluster_2411_error:
        pytest.fail(_cluster_2411_error[0], pytrace=False)
    box = Sandbox(TEST_SANDBOX_2411_ROOT, slurm="24.11")
    try:
        box.up(install=False, log=lambda m: None)
    except Exception as exc:                # SandboxError, or the root's build (SlurmRootError)
        _cluster_2411_error.append(f"the Slurm 24.11 sandbox did not start:\n{exc}")
        pytest.fail(_cluster_2411_error[0], pytrace=False)
    yield Cluster(box)
    box.down(log=lambda m: None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the daemons' logs to a failed cluster test."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("cluster") is not None:
        root = TEST_SANDBOX_2411_ROOT if "cluster_2411" in item.fixturenames else TEST_SANDBOX_ROOT
        report.sections.append(("sandbox daemon logs", Sandbox(root).log_tails(40)))

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

from helpers import (
    RELEASES, TEST_SANDBOX_ROOT, TEST_SLURM, Cluster, public_base, release_package, release_sandbox_root,
)
from tether.sandbox.cluster import Sandbox

# Hypothesis: `ci` keeps the unit level fast; `thorough` is what the properties were first run with.
settings.register_profile("ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The test run builds tether's C with -Werror (tether.system.toolchain.cflags); a site's install does not.
os.environ.setdefault("TETHER_WERROR", "1")

def pytest_configure(config):
    """On another Slurm release (TETHER_TEST_SLURM) the tests' temporary files live in the release's
    sandbox directory, the one host directory its Debian root sees at the same path (its /tmp and
    /var/tmp are its own)."""
    if TEST_SLURM and not config.option.basetemp:
        config.option.basetemp = f"{release_sandbox_root(TEST_SLURM)}/pytest-tmp"


def pytest_collection_modifyitems(config, items):
    """On another Slurm release (TETHER_TEST_SLURM) the tests of the release_cluster fixture are not
    collected: the first pass (the host's Slurm) runs them on every release."""
    if not TEST_SLURM:
        return
    chosen = [item for item in items if "release_cluster" not in getattr(item, "fixturenames", ())]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen


@pytest.fixture
def public_dir():
    """A directory other users can reach (pytest's tmp_path is under a root-only 0700 directory);
    in /var/tmp, or in the sandbox directory of another Slurm release (see pytest_configure)."""
    path = Path(tempfile.mkdtemp(prefix="tether-test-", dir=public_base()))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_cluster_error: list[str] = []


@pytest.fixture(scope="session")
def cluster():
    """Start the sandbox once for the session; fail (never skip) when it cannot start."""
    if _cluster_error:
        pytest.fail(_cluster_error[0], pytrace=False)
    try:
        # another release installs tether in its root from the package built for it, as a site does
        box = (Sandbox(release_sandbox_root(TEST_SLURM), slurm=TEST_SLURM, package=release_package(TEST_SLURM))
               if TEST_SLURM else Sandbox(TEST_SANDBOX_ROOT))
        box.up(install=False, log=lambda m: None)
    except Exception as exc:                # SandboxError, or a Slurm root's build (SlurmRootError)
        _cluster_error.append(f"the sandbox cluster did not start:\n{exc}")
        pytest.fail(_cluster_error[0], pytrace=False)
    yield Cluster(box)
    box.down(log=lambda m: None)


_release_errors: dict[str, str] = {}


@pytest.fixture(scope="session", params=RELEASES)
def release_cluster(request):
    """The same sandbox on each newer Slurm release (tests/helpers.RELEASES), in a Debian root of
    its own that is built once and cached (about a minute each); fails, never skips, when it
    cannot start. One at a time: each stops when its tests are done."""
    release = request.param
    if release in _release_errors:
        pytest.fail(_release_errors[release], pytrace=False)
    try:
        box = Sandbox(release_sandbox_root(release), slurm=release, package=release_package(release))
        box.up(install=False, log=lambda m: None)
    except Exception as exc:                # SandboxError, or the root's build (SlurmRootError)
        _release_errors[release] = f"the Slurm {release} sandbox did not start:\n{exc}"
        pytest.fail(_release_errors[release], pytrace=False)
    yield Cluster(box)
    box.down(log=lambda m: None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the daemons' logs to a failed cluster test."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("cluster") is not None:
        release = item.callspec.params.get("release_cluster") if hasattr(item, "callspec") else None
        release = release or TEST_SLURM
        root = release_sandbox_root(release) if release else TEST_SANDBOX_ROOT
        report.sections.append(("sandbox daemon logs", Sandbox(root).log_tails(40)))

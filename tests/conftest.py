"""Shared fixtures: configs, and the real local Slurm cluster for ``@pytest.mark.cluster`` tests.

The cluster (slurmctld + 3 slurmd + munge, see tether.hooks.sandbox) starts once per session in
its own directory and on free ports, so it never collides with a sandbox a developer started.
A cluster that cannot start fails the tests that need it; it never skips them.
"""

from __future__ import annotations

import os
import runpy
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

from tether.hooks.config import validate_config
from tether.hooks.proc import run_command

TEST_SANDBOX_ROOT = os.environ.get("TETHER_TEST_SANDBOX_DIR", "/var/lib/tether/sandbox-pytest")
REPO = Path(__file__).resolve().parent.parent


def make_config(**data: Any):
    """A validated Config from keyword settings (everything else at defaults)."""
    return validate_config(data, "<test config>")


class Cluster:
    """Handle on the running sandbox for tests: run Slurm commands as root or as the job user."""

    def __init__(self, box):
        self.box = box
        self.user = box.user

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 120, cwd: str | None = None,
            input: str | None = None):
        return run_command(list(argv), env=self.box.command_env(), check=check, timeout=timeout,
                           cwd=cwd or str(self.box.work_dir), input=input)

    def as_user(self, argv: Sequence[str], **kw):
        """Run ``argv`` as the unprivileged job user (as real users submit jobs)."""
        return self.run(["runuser", "-u", self.user, "--", *argv], **kw)

    def job_fields(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a mapping (values are Slurm's text)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        fields = {}
        for word in out.split():
            key, eq, value = word.partition("=")
            if eq:
                fields[key] = value
        return fields


_cluster_error: list[str] = []


@pytest.fixture(scope="session")
def cluster():
    """Start the sandbox once for the session; fail (never skip) when it cannot start."""
    from tether.hooks.sandbox import Sandbox, SandboxError

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the daemons' logs to a failed cluster test."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("cluster") is not None:
        from tether.hooks.sandbox import Sandbox

        report.sections.append(("sandbox daemon logs", Sandbox(TEST_SANDBOX_ROOT).log_tails(40)))


# ---- helpers shared by the run-side and container tests ----------------------------------------
def parse(lines: str) -> list[dict[str, str]]:
    out = []
    for line in lines.splitlines():
        if "RANK=" in line:
            out.append(dict(w.split("=", 1) for w in line.split(": ", 1)[-1].split() if "=" in w))
    return sorted(out, key=lambda r: int(r["RANK"]))


def storage(cluster) -> Path:
    return cluster.box.root / "jobs"


def job_entries(cluster) -> set[str]:
    return {p.name for p in storage(cluster).iterdir() if p.name.isdigit()}


def user_processes(cluster, pattern: str) -> list[str]:
    out = cluster.run(["ps", "-u", cluster.user, "-o", "pid=,stat=,args="], check=False).stdout
    return [l for l in out.splitlines() if pattern in l and not l.split()[1].startswith("Z")]


def wait_until(predicate, timeout: float = 30.0, step: float = 0.2):
    """Poll ``predicate`` until it returns something true (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def run_hook_file(path: Path, event):
    """Run a PBS hook file as PBS does (as ``__main__``) against the stub event set up for it; the
    hook must end with accept() or reject() (both raise SystemExit). Returns the event."""
    with pytest.raises(SystemExit):
        runpy.run_path(str(path), run_name="__main__")
    assert event.accepted is not None, "the hook ended without accept() or reject()"
    return event

"""Helpers shared by both test levels (fixtures live in the conftest.py files)."""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

from tether.hooks.config import validate_config
from tether.hooks.header import batch_header
from tether.hooks.policy import parse_qsub_args, parse_sbatch_args, split_qsub_args
from tether.hooks.render import resource_options, script_directives
from tether.hooks.request import Request
from tether.system.proc import CommandError

TEST_SANDBOX_ROOT = os.environ.get("TETHER_TEST_SANDBOX_DIR", "/var/lib/tether/sandbox-pytest")
# the newer Slurm releases the release_cluster fixture runs, each in a Debian root of its own
# (tether.sandbox.slurmroot); the host's is 22.05
RELEASES = ("24.11", "26.05")
# which Slurm the `cluster` fixture runs: the host's (unset), or one of RELEASES
TEST_SLURM = os.environ.get("TETHER_TEST_SLURM", "")


def release_sandbox_root(release: str) -> str:
    """The test sandbox directory of a Slurm release (``...-pytest-2411``)."""
    return f"{TEST_SANDBOX_ROOT}-{release.replace('.', '')}"


# runc's own warnings, which podman 5 without cgroups (rootless on cgroup v1: 24.11's root on this
# machine) lets through on the rank's stderr at every container's end: "cannot toggle freezer:
# cgroups not configured for container", "lstat : no such file or directory"
RUNC_WARNING = re.compile(r'^time="[^"]*" level=warning msg=')


def without_runc_warnings(text: str) -> str:
    """``text`` without runc's warning lines (see RUNC_WARNING)."""
    return "".join(line for line in text.splitlines(keepends=True) if not RUNC_WARNING.match(line))


def public_base() -> str:
    """Where tests make directories the job user can reach from every node: in the sandbox's own
    directory (shared by the nodes, as a site's shared filesystem; each node has its own /tmp and
    /var/tmp), made if missing."""
    base = f"{release_sandbox_root(TEST_SLURM) if TEST_SLURM else TEST_SANDBOX_ROOT}/public"
    os.makedirs(base, mode=0o755, exist_ok=True)
    return base


REPO = Path(__file__).resolve().parent.parent
# tether's Debian package for each Slurm release, built from this checkout once per source state
PACKAGE_CACHE = Path("/var/cache/tether/test-packages")     # root's only: root installs what is there
_SOURCE_SKIP = {".git", "build", "dist", "tests", "bench", "__pycache__", ".pytest_cache", ".hypothesis"}


def _source_digest() -> str:
    """A digest of what goes into tether's package from this checkout (not the tests or benchmarks)."""
    import hashlib

    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = sorted(d for d in dirnames if d not in _SOURCE_SKIP and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path.is_file() and not name.endswith((".pyc", ".so", ".o")):
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def release_package(release: str) -> Path:
    """tether's Debian package for Slurm ``release``, built in its Debian root by ``tools/deb.py
    --slurm-release`` (about a minute), the way a site builds it -- once per state of the sources:
    the suite's passes on 24.11 and 26.05 reuse it. The release sandboxes install tether from it."""
    PACKAGE_CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(PACKAGE_CACHE, 0o700)
    out = PACKAGE_CACHE / release / _source_digest()
    made = sorted(out.glob("tether-slurm*.deb"))
    if made:
        return made[-1]
    shutil.rmtree(PACKAGE_CACHE / release, ignore_errors=True)
    out.mkdir(parents=True)
    result = subprocess.run([sys.executable, str(REPO / "tools" / "deb.py"), "--out", str(out),
                             "--wheel-python", sys.executable, "--slurm-release", release],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise RuntimeError(f"tools/deb.py --slurm-release {release} failed:\n{result.stdout}{result.stderr}")
    return Path(result.stdout.split()[-1])


def make_config(**data: Any):
    """A validated Config from keyword settings (everything else at defaults)."""
    return validate_config(data, "<test config>")


# ---- plans as the resource tables spell them ----------------------------------------------------
def options(plan) -> tuple:
    """A plan's resources as (option, value) pairs: ``(("--gpus", "8"), ("--nodes", "1-8"))``."""
    return tuple(resource_options(plan))


def extra(plan) -> tuple:
    """The options a plan passes through, as (name, value) pairs."""
    return tuple((a.name, a.value) for a in plan.extra_args)


def with_sbatch_args(args: Sequence[str], **fields: Any) -> Request:
    """A Request with sbatch arguments, parsed as a job spec's would be."""
    return Request(sbatch_args=tuple(parse_sbatch_args(list(args))), **fields)


def with_qsub_args(args: Sequence[str], **fields: Any) -> Request:
    """A Request with qsub arguments, parsed as a job spec's would be."""
    return Request(qsub=split_qsub_args(parse_qsub_args(list(args))), **fields)


def directives(request: Request, plan, log_dir: str | None = None) -> list[str]:
    """The header directives of a tether batch script for ``request`` planned as ``plan``."""
    return script_directives(plan, batch_header(request, log_dir))


def env_prefix(env: dict[str, str] | None) -> list[str]:
    """``["env", "K=V", ...]`` to put before a command that should see ``env`` too; [] without it."""
    return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []


def merged(records: list[dict[str, str]]) -> dict[str, str]:
    """A job's ``scontrol -o show job`` records as one mapping, later ones overriding earlier ones."""
    return {key: value for record in records for key, value in record.items()}


class Cluster:
    """Handle on the running sandbox for tests: run Slurm commands as root or as the job user."""

    def __init__(self, box):
        self.box = box
        self.user = box.user
        self.nodes = box.nodes          # ("n1", "n2", "n3"); another release names its own

    def gres(self, spec: str) -> str:
        """A TRES-per-job/node/task value as this Slurm's scontrol spells it: ``gres:gpu:2`` on
        22.05, ``gres/gpu:2`` from 23.02 on (the host's Slurm is 22.05)."""
        return f"gres/{spec}" if self.box.release() else f"gres:{spec}"

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 120, cwd: str | None = None,
            input: str | None = None):
        return self.box.slurm(list(argv), check=check, timeout=timeout, cwd=cwd or str(self.box.work_dir),
                              input=input)

    def as_user(self, argv: Sequence[str], **kw):
        """Run ``argv`` as the unprivileged job user (as real users submit jobs)."""
        return self.run(["runuser", "-u", self.user, "--", *argv], **kw)

    def on_node_as_user(self, node: str | None, argv: Sequence[str], *, check: bool = True, cwd: str = "/",
                        timeout: float = 120):
        """Run ``argv`` as the job user on ``node`` (None: the first) outside Slurm, as a user
        logged in there would (Sandbox.on_node: the node's own /tmp, /run, stores, hostname)."""
        return self.run(self.box.on_node(node, ["runuser", "-u", self.user, "--", *argv], cwd=cwd), check=check,
                        timeout=timeout)

    def job_fields(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as one mapping (values are Slurm's text; a heterogeneous job's
        later components override its earlier ones)."""
        return merged(self.box.job_records(job_id))

    def wait_job(self, job_id: str, timeout: float = 240) -> dict[str, str]:
        """Wait until the job has ended (Sandbox.poll_job: every 0.2 s); its final fields as
        ``job_fields`` gives them, the last seen if it has not ended after ``timeout`` s."""
        return merged(self.box.poll_job(job_id, timeout))

    def sbatch_wait(self, argv: Sequence[str], *, input: str | None = None, timeout: float = 300,
                    check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """What ``sbatch --wait ARGV`` as the job user gives (sbatch's output, the job's exit status
        as sbatch --wait computes it), but seen within 0.2 s of the job's end, where sbatch --wait
        looks after 2, 10, 42 s (Sandbox.wait_for_job)."""
        argv = [*env_prefix(env), "sbatch", *argv]
        submitted = self.as_user(argv, input=input, check=check)
        # "N", "N;cluster" (--parsable) or "Submitted batch job N"
        job = next((w.split(";")[0] for w in submitted.stdout.split() if w.split(";")[0].isdigit()), None)
        if submitted.returncode != 0 or job is None:
            return submitted
        code = self.box.wait_for_job(job, timeout=timeout)
        if check and code != 0:
            raise CommandError([*argv, "(waited for the job)"], code, submitted.stdout, submitted.stderr)
        return subprocess.CompletedProcess(argv, code, submitted.stdout, submitted.stderr)

    def submit(self, *argv: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        """``sbatch --parsable ARGV`` as the job user (``env``: extra variables); the job id."""
        result = self.as_user([*env_prefix(env), "sbatch", "--parsable", *argv], check=check)
        return result.stdout.strip().split(";")[0]

    def ctld_log_mark(self) -> int:
        """Where slurmctld's log ends now (for ``ctld_log_since``)."""
        path = self.box.log_dir / "slurmctld.log"
        return path.stat().st_size if path.exists() else 0

    def ctld_log_since(self, mark: int) -> str:
        """What slurmctld logged after ``mark`` (other tests' lines stay out)."""
        with open(self.box.log_dir / "slurmctld.log", "rb") as fh:
            fh.seek(mark)
            return fh.read().decode(errors="replace")

    def node_states(self) -> dict[str, str]:
        """{node: state} with Slurm's flags (drain, down, ...) kept."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def in_service(self) -> bool:
        """No node left the idle/allocated states (drained, down, failing). "planned" is Slurm
        22.05's idle node that backfill has reserved for a pending job, "mixed-" Slurm 24.11's
        partly used one (sinfo's "-" suffix): in service."""
        return all(state.rstrip("*~#$@+-") in ("idle", "mixed", "allocated", "completing", "planned")
                   for state in self.node_states().values())


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
    """Run a PBS hook file as PBS does (as ``__main__``) against the stand-in event set up for it;
    the hook must end with accept() or reject(). Returns the event (tether.testing.pbs.run_hook)."""
    from tether.testing.pbs import run_hook

    return run_hook(path, event)


def cpu_seconds(text: str) -> float:
    """Slurm's [DD-][HH:]MM:SS[.mmm] as seconds."""
    days, _, rest = text.strip().rpartition("-")
    total = 0.0
    for part in rest.split(":"):
        total = total * 60 + float(part)
    return total + int(days or 0) * 86400


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (this machine's PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

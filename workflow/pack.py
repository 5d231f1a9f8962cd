"""Workflow packs on vanilla Slurm (docs/requirements.md, "Workflow packs").

A pack is a list of jobs, each with a ``delay`` (minutes) relative to the start of the first job.
The first job is submitted as it is; every other one with ``--dependency=after:<first>+<delay>``
("after the first job has started and <delay> minutes have passed": Slurm's own syntax), all
tagged ``--comment=tether-pack:<pack>:<name>`` and told their pack in ``TETHER_PACK`` /
``TETHER_PACK_JOB``. What vanilla Slurm gives and does not: the dependent job becomes *eligible*
at first-start + delay and starts when resources allow; Slurm plans no reservation for a job whose
dependency is unfulfilled (the backfill scheduler skips it), so the overlap the DEEP projects'
modified Slurm guarantees is here only as likely as free resources at that time. A pack that must overlap
for sure is a heterogeneous job (all components start together).

From inside a running job, ``release()`` drops the delay of the pack's jobs that wait on it
(``scontrol update JobId=… Dependency=after:<job>``: eligible now), and ``set_dependency(type)``
changes their dependency type (after, afterok, afterany, aftercorr) -- both only for pending jobs
of the same user and the same pack.

PBS: ``qsub -W depend=after:<first>`` with ``-a`` (an execution time of submission + delay: PBS
has no "start of another job + time"); release and set-dependency are Slurm only.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..hooks.errors import TetherError
from ..hooks.schema import Int, List, SchemaError, Str, Struct
from ..system.proc import CommandError, run_command

DEPENDENCY_TYPES = ("after", "afterok", "afterany", "aftercorr")
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
COMMENT_PREFIX = "tether-pack:"

JOB_SCHEMA = Struct(doc="one job of a pack", fields={
    "name": Str(pattern=NAME, accepted="a name of letters, digits, '_', '.', '-'", doc="the job's name in the pack"),
    "delay": Str(default="0", pattern=r"\d{1,6}(m|min|h)?", accepted="minutes (90, 90m) or hours (2h)",
                 doc="how long after the first job's start this one may start"),
    "sbatch_args": List(item=Str(), default=[], doc="sbatch options (tether's --slots and the rest)"),
    "qsub_args": List(item=Str(), default=[], doc="qsub options (PBS)"),
    "command": List(item=Str(), nullable=True, doc="the command (sbatch --wrap); or a script"),
    "script": Str(nullable=True, doc="the batch script (its #SBATCH lines apply)"),
})
PACK_SCHEMA = Struct(doc="a workflow pack", fields={
    "name": Str(pattern=NAME, default="pack", accepted="a name of letters, digits, '_', '.', '-'",
                doc="the pack's name (its id adds a random part)"),
    "jobs": List(item=JOB_SCHEMA, doc="the jobs; the first one starts the pack"),
})


class PackError(TetherError):
    """A pack tether cannot submit or change; the message says why."""


@dataclass(frozen=True)
class PackJob:
    name: str
    delay: int                      # minutes after the first job's start
    sbatch_args: tuple[str, ...]
    qsub_args: tuple[str, ...]
    command: tuple[str, ...] | None
    script: str | None


def _minutes(text: str) -> int:
    number = int(re.match(r"\d+", text).group())
    return number * 60 if text.endswith("h") else number


def parse_pack(data: Any, source: str = "pack") -> tuple[str, list[PackJob]]:
    """(the pack's name, its jobs) from a mapping; every problem at once."""
    if isinstance(data, Mapping) and isinstance(data.get("jobs"), list):     # delay: 5 (YAML's integer)
        data = {**data, "jobs": [{**j, "delay": str(j["delay"])} if isinstance(j, Mapping) and
                                 isinstance(j.get("delay"), int) and not isinstance(j.get("delay"), bool) else j
                                 for j in data["jobs"]]}
    errors: list[SchemaError] = []
    doc = PACK_SCHEMA.check({} if data is None else data, "", errors)
    jobs = []
    if not errors:
        if not doc.get("jobs"):
            errors.append(SchemaError("jobs", "a pack needs at least one job"))
        names = [j.get("name") for j in doc.get("jobs") or []]
        for i, job in enumerate(doc.get("jobs") or []):
            where = f"jobs[{i}]"
            if not job.get("name"):
                errors.append(SchemaError(f"{where}.name", "is required"))
            elif names.count(job["name"]) > 1:
                errors.append(SchemaError(f"{where}.name", f"{job['name']!r} is used twice"))
            if bool(job.get("command")) == bool(job.get("script")):
                errors.append(SchemaError(where, "give a command or a script (one of them)"))
            if i == 0 and _minutes(job["delay"]) != 0:
                errors.append(SchemaError(f"{where}.delay", "the first job starts the pack: its delay is 0"))
            jobs.append(PackJob(job.get("name") or "", _minutes(job["delay"]), tuple(job["sbatch_args"]),
                                tuple(job["qsub_args"]), tuple(job["command"]) if job.get("command") else None,
                                job.get("script")))
    if errors:
        raise PackError("\n".join(f"{source}: {e}" for e in errors))
    return doc["name"], jobs


def _submit_one(job: PackJob, pack: str, extra: Sequence[str], env: Mapping[str, str], scheduler: str) -> str:
    import tempfile

    tag = f"{COMMENT_PREFIX}{pack}:{job.name}"
    job_env = {**env, "TETHER_PACK": pack, "TETHER_PACK_JOB": job.name}
    if scheduler == "slurm":
        argv = ["sbatch", "--parsable", f"--comment={tag}", "--export=ALL", *extra, *job.sbatch_args]
    else:
        argv = ["qsub", "-v", f"TETHER_PACK={pack},TETHER_PACK_JOB={job.name}", *extra, *job.qsub_args]
    script_file = None
    try:
        if job.script is not None:
            fd, script_file = tempfile.mkstemp(prefix="tether-pack-", suffix=".sh")
            with os.fdopen(fd, "w") as fh:
                fh.write(job.script)
            argv.append(script_file)
        elif scheduler == "slurm":
            argv.append("--wrap=" + " ".join(shlex.quote(w) for w in job.command))
        else:
            argv += ["--", *job.command]
        out = run_command(argv, env=job_env, timeout=120).stdout.strip()
    except CommandError as exc:
        raise PackError(f"{job.name}: {argv[0]} refused it: {(exc.stderr or str(exc)).strip()}") from None
    finally:
        if script_file:
            os.unlink(script_file)
    return out.split(";")[0].splitlines()[-1]


def submit_pack(data: Any, *, env: Mapping[str, str] | None = None, scheduler: str = "slurm") -> dict:
    """Submit a pack as the calling user: ``{"pack": id, "jobs": {name: job id}}``. When a job is
    refused, the ones already submitted are cancelled (a pack goes in whole or not at all)."""
    name, jobs = parse_pack(data)
    env = dict(os.environ if env is None else env)
    pack = f"{name}-{secrets.token_hex(3)}"
    submitted: dict[str, str] = {}
    try:
        for i, job in enumerate(jobs):
            if i == 0:
                extra: list[str] = []
            elif scheduler == "slurm":
                first = submitted[jobs[0].name]
                extra = [f"--dependency=after:{first}" + (f"+{job.delay}" if job.delay else "")]
            else:
                first = submitted[jobs[0].name]
                extra = ["-W", f"depend=after:{first}"]
                if job.delay:
                    extra += ["-a", time.strftime("%Y%m%d%H%M.%S", time.localtime(time.time() + job.delay * 60))]
            submitted[job.name] = _submit_one(job, pack, extra, env, scheduler)
    except PackError:
        if submitted:
            cancel = ["scancel"] if scheduler == "slurm" else ["qdel"]
            run_command([*cancel, *submitted.values()], env=env, timeout=60, check=False)
        raise
    return {"pack": pack, "jobs": submitted}


def _queue(env: Mapping[str, str]) -> list[dict]:
    """This user's jobs as squeue shows them: id, state, dependency, comment."""
    user = env.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
    # -t all: also the jobs that ended within MinJobAge (the pack's status)
    out = run_command(["squeue", "-h", "-t", "all", "-u", user, "-o", "%i|%T|%E|%k|%j"], env=env, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split("|", 4)
        if len(parts) == 5:
            rows.append({"id": parts[0], "state": parts[1], "dependency": parts[2], "comment": parts[3],
                         "name": parts[4]})
    return rows


def _this_job(job_id: str | None, env: Mapping[str, str]) -> str:
    job = job_id or env.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        raise PackError("give --job ID, or run this inside a job of the pack (SLURM_JOB_ID)")
    return job


def dependents(job_id: str | None = None, env: Mapping[str, str] | None = None) -> list[dict]:
    """The pending jobs of this user and of ``job_id``'s pack whose dependency names ``job_id``."""
    env = dict(os.environ if env is None else env)
    job = _this_job(job_id, env)
    rows = _queue(env)
    mine = next((r for r in rows if r["id"] == job), None)
    if mine is None:
        raise PackError(f"job {job} is not one of your jobs in the queue")
    if not mine["comment"].startswith(COMMENT_PREFIX):
        raise PackError(f"job {job} is not in a tether pack (its comment is {mine['comment']!r})")
    pack = mine["comment"].split(":")[1]
    names = re.compile(rf"(^|[,?:])(after\w*):{job}(\+\d+)?(\(|,|\?|:|$)")
    return [r for r in rows if r["state"] == "PENDING" and r["comment"].startswith(f"{COMMENT_PREFIX}{pack}:")
            and names.search(r["dependency"])]


def _update(jobs: list[dict], dependency: str, env: Mapping[str, str]) -> list[str]:
    changed = []
    for row in jobs:
        try:
            run_command(["scontrol", "update", f"JobId={row['id']}", f"Dependency={dependency}"], env=env, timeout=60)
        except CommandError as exc:
            raise PackError(f"could not change job {row['id']}: {(exc.stderr or str(exc)).strip()}") from None
        changed.append(row["id"])
    return changed


def release(job_id: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """Make the jobs of the pack waiting on ``job_id`` (default: this job) eligible now: their
    delay goes (``after:<job>``); the ids changed."""
    env = dict(os.environ if env is None else env)
    job = _this_job(job_id, env)
    return _update(dependents(job, env), f"after:{job}", env)


def set_dependency(kind: str, job_id: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """Change the dependency of the pack's jobs waiting on ``job_id`` to ``kind:<job>``."""
    if kind not in DEPENDENCY_TYPES:
        raise PackError(f"--type {kind}: one of {', '.join(DEPENDENCY_TYPES)}")
    env = dict(os.environ if env is None else env)
    job = _this_job(job_id, env)
    return _update(dependents(job, env), f"{kind}:{job}", env)


def _pbs_pack_status(pack: str, env: Mapping[str, str]) -> list[dict]:
    """The pack's jobs of this user from ``qstat -f -F json -x`` (tether's one PBS client): a pack's
    job carries ``TETHER_PACK``/``TETHER_PACK_JOB`` in its variables (qsub -v)."""
    from ..launcher.states import pbs_state
    from ..pbs_hooks.commands import PBSCommandError, job_status

    me = env.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
    try:
        jobs = job_status(history=True, env=env)
    except PBSCommandError as exc:
        raise PackError(f"qstat: {exc}") from None
    rows = []
    for job_id, job in jobs.items():
        pid = pack_of(f"{COMMENT_PREFIX}{job.variables.get('TETHER_PACK', '')}:", pack)
        if pid and job.owner == me:
            state = pbs_state(job)        # FINISHED said nothing of success: COMPLETED/FAILED/... as on Slurm
            rows.append({"id": job_id, "state": state.state, "exit_code": state.exit_code,
                         "pbs_state": job.state_code, "dependency": str(job.attrs.get("depend", "")),
                         "comment": f"{COMMENT_PREFIX}{pid}:{job.variables.get('TETHER_PACK_JOB', '')}",
                         "pack": pid, "job": job.variables.get("TETHER_PACK_JOB", "")})
    return sorted(rows, key=lambda r: [int(p) if p.isdigit() else 0 for p in r["id"].split(".")[:1]])


def pack_of(comment: str, pack: str) -> str | None:
    """The pack id of a job's comment when it is ``pack``'s: the id itself (``name-1a2b3c``) or the
    pack's name (every pack of that name)."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    pid = comment[len(COMMENT_PREFIX):].partition(":")[0]
    suffix = pid[len(pack) + 1:]
    if pid == pack or (pid.startswith(f"{pack}-") and len(suffix) == 6 and all(c in "0123456789abcdef" for c in suffix)):
        return pid
    return None


def pack_status(pack: str, env: Mapping[str, str] | None = None, *, scheduler: str = "slurm") -> list[dict]:
    """The jobs of the pack ``pack`` (its id, or its name: every pack of that name): from squeue
    while queued or running, else from sacct; on PBS from qstat (finished ones too, where the
    server keeps its history). Each row names its pack."""
    env = dict(os.environ if env is None else env)
    if scheduler == "pbs":
        return _pbs_pack_status(pack, env)
    rows = [r for r in _queue(env) if pack_of(r["comment"], pack)]
    seen = {r["id"] for r in rows}
    out = run_command(["sacct", "-n", "-X", "-P", "-o", "JobID,State,Start,End,Comment", "-S", "now-7days"],
                      env=env, timeout=60, check=False).stdout
    for line in out.splitlines():
        job, state, start, end, comment = (line.split("|") + [""] * 5)[:5]
        if pack_of(comment, pack) and job not in seen:
            rows.append({"id": job, "state": state.split()[0], "dependency": "", "comment": comment,
                         "start": start, "end": end})
    for r in rows:
        r["pack"] = pack_of(r["comment"], pack)
        r["job"] = r["comment"].split(":", 2)[2] if r["comment"].count(":") >= 2 else ""
    return sorted(rows, key=lambda r: int(r["id"]) if r["id"].isdigit() else 0)

"""The launcher service: one job's life -- submit, status, logs, cancel, cleanup -- with state on
the filesystem only.

State: one JSON record per job in ``launcher.state_root`` (the service account's, 0700), written
whole or not at all (a temporary file renamed over it) under a per-job lock, so concurrent
requests never lose an update and a half-written record is never read. A job is recorded as
PREPARING before anything else happens and its scheduler id is added once the scheduler gave one;
if the service dies in between, the next look finds the job by its name (``tether_<type>-<id>``),
so nothing acknowledged -- nor anything submitted -- is lost.

What touches a user's files or acts in a user's name runs as that user: ``sudo -n -u USER
<launcher.agent>`` with the request on stdin (tether.launcher.agent). The service never runs as root,
and never acts as itself for a client: it acts for the members of ``launcher.users_group`` only (the
sudo policy's Runas group, checked by the service too), never for root or its own account.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import pwd
import secrets
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from ..hooks.config import Config
from ..hooks.errors import RequestError, TetherError
from ..hooks.header import batch_header, job_name
from ..hooks.plan import make_plan
from ..hooks.render import script_directives
from ..system.files import write_atomic
from ..system.proc import CommandError, run_command
from .agent import ENV_PASSED
from .jobspec import LaunchSpec, parse_launch_spec
from .states import JobState, pbs_job_state, slurm_job_state

ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
STARTUP_EXIT_CODES = (125, 126, 127)      # the container could not start; the command is not there / not runnable
KEPT_LOG_BYTES = 64 << 10                 # of each log, kept in the record when the tree goes


class LauncherError(TetherError):
    """A request the launcher refuses or cannot carry out. ``status``: the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def new_id() -> str:
    """A launcher job id: time-ordered, unguessable, of [a-z0-9-] (what the agent accepts)."""
    return f"{int(time.time()):x}-{''.join(secrets.choice(ID_ALPHABET) for _ in range(12))}"


def check_id(job: str) -> str:
    if not isinstance(job, str) or not 8 <= len(job) <= 64 or not set(job) <= set(ID_ALPHABET + "-"):
        raise LauncherError(f"no launcher job {str(job)[:64]!r} (ids look like 6567ab12-k3j2...)", 404)
    return job


class Launcher:
    """The launcher for one config. ``runner`` runs the agent (tests); ``allow_root`` only for a test
    that drives it as root with such a runner: the real service refuses root."""

    def __init__(self, config: Config, *, env: Mapping[str, str] | None = None,
                 runner: Callable[[str, dict], dict] | None = None, allow_root: bool = False):
        if os.geteuid() == 0 and not allow_root:
            raise LauncherError("tether's launcher does not run as root: run it as the service account "
                                f"({config.data['launcher']['service_user']}; see `tether launcher install`)", 500)
        self.config = config
        settings = config.data["launcher"]
        self.scheduler: str = settings["scheduler"]
        self.state_root: str = settings["state_root"]
        self.job_root: str = settings["job_root"] or os.path.join(config.job_storage_root, "launcher")
        self.agent: str = settings["agent"]
        self.auto_cleanup: bool = settings["auto_cleanup"]
        self.excerpt_lines: int = settings["log_excerpt_lines"]
        self.service_user: str = settings["service_user"]
        self.users_group: str = settings["users_group"]
        self.env = dict(os.environ if env is None else env)
        self.runner = runner or self._run_agent
        self.tether = _tether_command()

    # --- the records ----------------------------------------------------------------------------
    def _record_path(self, job: str) -> str:
        return os.path.join(self.state_root, f"{check_id(job)}.json")

    def _state_error(self, exc: OSError, path: str | None = None) -> LauncherError:
        """A state file the service cannot use: most often a command run by another account."""
        where = path or exc.filename or self.state_root
        me = _user_name(os.geteuid())
        hint = (f" (the launcher runs as its service account {self.service_user}, not {me}: see `tether "
                f"launcher install`)" if me != self.service_user else "")
        return LauncherError(f"launcher.state_root: {where}: {exc.strerror or exc}{hint}", 500)

    def _ensure_state_root(self) -> None:
        try:
            os.makedirs(self.state_root, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise self._state_error(exc, self.state_root) from None

    @contextmanager
    def _locked(self, job: str, *, new: bool = False) -> Iterator[None]:
        """One request at a time per job (a status and a cleanup, two cancels). The lock is a file in
        ``.locks`` that exists only while the job has a record: an unknown id makes nothing, and the
        holder removes it when the record is gone. Whoever opened it before it went finds the name no
        longer naming their file and opens it again: the holder is always who locked the file the
        name names, so removing it never lets two in at once. ``new``: a record about to be made."""
        record = self._record_path(job)
        if not new and not os.path.exists(record):
            raise LauncherError(f"no launcher job {job}", 404)
        self._ensure_state_root()
        locks = os.path.join(self.state_root, ".locks")
        path = os.path.join(locks, job)
        try:
            try:
                os.mkdir(locks, 0o700)
            except FileExistsError:
                pass
            while True:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held = os.fstat(fd)
                    try:
                        named = os.stat(path, follow_symlinks=False)
                    except FileNotFoundError:
                        named = None
                except BaseException:
                    os.close(fd)
                    raise
                if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                    break
                os.close(fd)                     # removed (or replaced) while we waited: the current one
        except OSError as exc:
            raise self._state_error(exc) from None
        try:
            yield
        finally:
            try:
                if not os.path.exists(record):
                    os.unlink(path)
            finally:
                os.close(fd)

    def _read(self, job: str) -> dict:
        try:
            with open(self._record_path(job), encoding="utf-8") as fh:
                return json.load(fh)
        except FileNotFoundError:
            raise LauncherError(f"no launcher job {job}", 404) from None
        except OSError as exc:
            raise self._state_error(exc) from None

    def _write(self, record: dict) -> None:
        record["updated"] = time.time()
        try:
            write_atomic(self._record_path(record["id"]), json.dumps(record, indent=1, sort_keys=True) + "\n", 0o600)
        except OSError as exc:
            raise self._state_error(exc) from None

    # --- the agent ------------------------------------------------------------------------------
    def check_user(self, user: str) -> None:
        """Refuse (403) a user the service may not act for: root, its own account (which owns every
        record), anyone outside ``launcher.users_group`` -- the service's own word, not only sudo's."""
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise LauncherError(f"no user {user!r} on this host") from None
        if entry.pw_uid == 0:
            raise LauncherError("the launcher never acts for root", 403)
        if entry.pw_uid == os.geteuid() or user == self.service_user:
            raise LauncherError(f"the launcher never acts as its own service account ({user}): a job runs as "
                                f"its user, a member of {self.users_group}", 403)
        try:
            gid = grp.getgrnam(self.users_group).gr_gid
        except KeyError:
            raise LauncherError(f"launcher.users_group {self.users_group}: no such group on this host (an admin "
                                f"creates it: see `tether launcher install`)", 500) from None
        if gid not in os.getgrouplist(user, entry.pw_gid):
            raise LauncherError(f"the launcher acts only for members of the group {self.users_group}: {user} is "
                                f"not one (an admin adds them: usermod -a -G {self.users_group} {user})", 403)

    def _run_agent(self, user: str, request: dict) -> dict:
        """The agent as ``user``, through sudo (always: the service never acts as itself)."""
        argv = ["sudo", "-n", "-u", user, "--", self.agent]
        try:
            done = run_command(argv, input=json.dumps(request), timeout=300, check=False, new_session=False,
                               env={k: v for k, v in self.env.items() if k in ENV_PASSED})
        except CommandError as exc:
            if exc.kind == "timeout":
                raise LauncherError(f"the agent acting for {user} did not answer within 300 s", 504) from None
            raise LauncherError(f"cannot run {argv[0]} on this host: {exc.reason}", 500) from None
        try:
            answer = json.loads(done.stdout) if done.stdout.strip() else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            return answer                          # the agent's refusal: _agent says it
        if done.returncode != 0 or not isinstance(answer, dict):
            said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            me = _user_name(os.geteuid())
            raise LauncherError(f"the sudo policy does not let {me} act for {user} ({said}); an admin adds "
                                f"{user} to the group {self.users_group} (see `tether launcher install`)", 403)
        return answer

    def _agent(self, user: str, op: str, **fields: Any) -> dict:
        self.check_user(user)
        request = {"op": op, "job_root": self.job_root, "scheduler": self.scheduler,
                   "env": {k: v for k, v in self.env.items() if k in ENV_PASSED}, **fields}
        answer = self.runner(user, request)
        if "error" in answer:
            raise LauncherError(str(answer["error"]), 409 if "exists" in str(answer["error"]) else 400)
        return answer

    # --- the operations -------------------------------------------------------------------------
    def batch_script(self, spec: LaunchSpec, tree: str) -> str:
        """The batch script for ``spec``: tether's directives (the options it controls and the resources
        of the plan, logs in the tree), then one container per node (srun; PBS: pbs_tmrsh per host)
        or the command itself."""
        from ..container.scripts import compose_batch_script, host_script, pbs_launch_script, slurm_launch_script
        from ..container.spec import LaunchError

        plan = make_plan(spec.request, self.config, self.scheduler)
        directives = script_directives(plan, batch_header(spec.request, tree))
        env = dict(spec.environment)
        if os.path.isabs(self.config.source):      # the job's `tether run` reads the service's config
            env["TETHER_CONFIG"] = self.config.source
        try:
            if spec.image:
                # the staged files: the job's working directory on the host, and in the container
                files = os.path.join(tree, "files")
                options = dict(spec.container)
                options["container-mounts"] = ",".join(m for m in (options.get("container-mounts"), f"{files}:{files}")
                                                       if m)
                options.setdefault("container-workdir", files)
                runtime = self.config.data["container"]["runtime"]
                if self.scheduler == "pbs":      # the job's variables reach its hosts in a file of its tree
                    body = pbs_launch_script(spec.command, options, env, tether=self.tether,
                                             default_runtime=runtime, env_dir=tree)
                else:
                    body = slurm_launch_script(spec.command, options, env, tether=self.tether,
                                               default_runtime=runtime)
            else:
                body = host_script(spec.command, env)
        except LaunchError as exc:
            raise LauncherError(str(exc)) from None
        return compose_batch_script(directives, body)

    def submit(self, data: Any) -> dict:
        """Check the spec, make the job's tree as its user, submit as its user; the record."""
        if isinstance(data, Mapping) and "job_id" in data:
            raise LauncherError("job_id: the launcher names its jobs itself (tether_<job_type>-<launcher id>)")
        job = new_id()
        try:
            spec = parse_launch_spec({**data, "job_id": job} if isinstance(data, Mapping) else data, self.scheduler)
        except RequestError as exc:
            raise LauncherError(str(exc)) from None
        tree = os.path.join(self.job_root, job)
        try:
            script = self.batch_script(spec, tree)
        except RequestError as exc:
            raise LauncherError(str(exc)) from None
        record = {"id": job, "user": spec.user, "scheduler": self.scheduler, "job_name": job_name(spec.request),
                  "job_id": None, "tree": tree, "phase": "preparing", "state": "PREPARING", "exit_code": None,
                  "created": time.time(), "spec": dict(spec.raw)}
        record["spec"].pop("files", None)            # the staged files stay in the tree only,
        record["spec"]["environment"] = sorted(spec.environment)   # and the values in the script
        self.check_user(spec.user)                   # before anything is written
        with self._locked(job, new=True):
            self._write(record)                      # before anything exists: a crash leaves a findable trace
            try:
                answer = self._agent(spec.user, "prepare", id=job, script=script, files=spec.files, submit=True,
                                     spec={k: v for k, v in spec.raw.items() if k != "files"})
            except LauncherError as exc:
                self._forget(record)
                raise exc
            record.update(job_id=answer["job_id"], phase="submitted", state="PENDING", submitted=time.time())
            self._write(record)
        return record

    def _forget(self, record: dict) -> None:
        """A submission that failed: its tree (if made) and its record go."""
        try:
            self._agent(record["user"], "remove", id=record["id"])
        except LauncherError:
            pass
        try:
            os.unlink(self._record_path(record["id"]))
        except FileNotFoundError:
            pass

    def _scheduler_state(self, record: dict) -> JobState:
        look = slurm_job_state if record["scheduler"] == "slurm" else pbs_job_state
        return look(record["job_id"], self.env)

    def _adopt(self, record: dict) -> None:
        """A record left PREPARING by a service that died: find its job by name, if it was submitted."""
        if record["scheduler"] != "slurm":
            return
        try:
            out = run_command(["squeue", "-h", "-u", record["user"], "-n", record["job_name"], "-o", "%i"], env=self.env,
                              timeout=30, check=False).stdout.split()
            if not out:
                out = run_command(["sacct", "-n", "-X", "-P", "-u", record["user"], "--name", record["job_name"],
                                   "-o", "JobID", "-S", time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                      time.localtime(record["created"] - 60))],
                                  env=self.env, timeout=30, check=False).stdout.split()
        except CommandError:
            return
        if out:
            record.update(job_id=out[0], phase="submitted", state="PENDING")

    def status(self, job: str) -> dict:
        """The record with the scheduler's current state; an ended job's tree goes (auto_cleanup),
        its log tails and, after a startup failure, the error log's excerpt stay in the record."""
        with self._locked(job):
            record = self._read(job)
            if record["phase"] == "preparing":
                self._adopt(record)
                if record["phase"] == "preparing" and time.time() - record["created"] > 600:
                    record.update(state="FAILED", reason="the launcher stopped before the job was submitted")
            if record["phase"] == "submitted":
                state = self._scheduler_state(record)
                record.update(state=state.state, exit_code=state.exit_code, reason=state.reason)
                if state.ended:
                    record["phase"] = "ended"
                    self._keep_logs(record)
            if record["phase"] == "ended" and self.auto_cleanup:
                self._remove_tree(record)
            self._write(record)
            return record

    def _keep_logs(self, record: dict) -> None:
        try:
            tails = self._agent(record["user"], "logs", id=record["id"], max_bytes=KEPT_LOG_BYTES)
        except LauncherError as exc:
            tails = {"out": None, "err": None, "unreadable": str(exc)}
        record["logs"] = tails
        excerpt = self.startup_failure(record, tails.get("err"))
        if excerpt:
            record["startup_failure"] = excerpt

    def startup_failure(self, record: dict, err: str | None) -> str | None:
        """The last lines of the error log when the job failed before its command ran (the tail that
        docs/requirements.md, "The launcher", asks for): a container that could not start (125), a
        command not found or not runnable (127, 126), or tether's own refusal in the log."""
        if record.get("state") != "FAILED" or not err:
            return None
        lines = err.rstrip("\n").splitlines()
        if record.get("exit_code") in STARTUP_EXIT_CODES or any(line.startswith("tether:") for line in lines):
            return "\n".join(lines[-self.excerpt_lines:])
        return None

    def _remove_tree(self, record: dict) -> None:
        if record.get("tree_removed"):
            return
        self._agent(record["user"], "remove", id=record["id"])
        record["tree_removed"] = True

    def logs(self, job: str) -> dict:
        """The job's output and error logs (their last MiB; once the tree is gone, what the record
        kept), and the startup-failure excerpt when there is one."""
        record = self.status(job)
        if record.get("tree_removed"):
            kept = record.get("logs") or {}
            return {"id": job, "state": record["state"], "out": kept.get("out"), "err": kept.get("err"),
                    "startup_failure": record.get("startup_failure"), "kept": True}
        tails = self._agent(record["user"], "logs", id=job, max_bytes=1 << 20)
        return {"id": job, "state": record["state"], "out": tails.get("out"), "err": tails.get("err"),
                "startup_failure": self.startup_failure(record, tails.get("err")), "kept": False}

    def cancel(self, job: str) -> dict:
        """scancel / qdel as the job's user; the record then says what the scheduler says."""
        with self._locked(job):
            record = self._read(job)
            if record["phase"] == "preparing":
                self._adopt(record)
            if record.get("job_id") and record["phase"] == "submitted":
                self._agent(record["user"], "cancel", job_id=record["job_id"])
                record["cancel_requested"] = time.time()
                self._write(record)
        return self.status(job)

    def cleanup(self, job: str) -> dict:
        """Remove the job's tree and record (a job still queued or running is cancelled first)."""
        record = self.status(job)
        if record["phase"] == "submitted":
            self.cancel(job)
        with self._locked(job):
            record = self._read(job)
            # a tree removed already is not looked for again: its name may be someone else's now; and
            # the agent leaves a name that is not the user's tree (gone, another's, a symlink) alone
            if not record.get("tree_removed"):
                self._agent(record["user"], "remove", id=job)
            try:
                os.unlink(self._record_path(job))
            except OSError as exc:
                raise self._state_error(exc) from None
        return {"id": job, "removed": True}

    def list(self) -> list[dict]:
        """Every record (complete files only), oldest first."""
        try:
            names = sorted(n for n in os.listdir(self.state_root) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._state_error(exc, self.state_root) from None
        records = []
        for name in names:
            try:
                with open(os.path.join(self.state_root, name), encoding="utf-8") as fh:
                    records.append(json.load(fh))
            except (OSError, ValueError):
                continue
        return sorted(records, key=lambda r: r.get("created", 0))

    def health(self) -> dict:
        """What the service needs: its state directory, the agent, the scheduler's commands."""
        import shutil

        checks = {"state_root": os.access(self.state_root, os.W_OK) or not os.path.exists(self.state_root),
                  "agent": os.access(self.agent, os.X_OK),
                  "scheduler": shutil.which("sbatch" if self.scheduler == "slurm" else "qsub",
                                            path=self.env.get("PATH")) is not None}
        return {"ok": all(checks.values()), "checks": checks, "scheduler": self.scheduler}


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _tether_command() -> str:
    """The ``tether`` of this installation (the compute nodes run the same install)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "tether")
    return candidate if os.access(candidate, os.X_OK) else "tether"

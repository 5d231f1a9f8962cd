"""The agent: what the launcher does as a user, run as that user (``sudo -n -u USER tether-agent``).

The sudo policy lets the service account run exactly this program, without arguments, as the
users of one group; the request comes as one JSON object on stdin and the answer goes back as one
JSON object on stdout (exit 0; 1 with ``{"error": ...}``). Nothing from the request reaches a
shell; the job's tree is made by the user, under ``launcher.job_root`` (root-owned, mode 1777 like
/tmp: every path is opened relative to a checked directory, never following a symlink), so the
user owns their job's files for its whole life and removes them themselves.

Operations: ``prepare`` (make the tree, stage the files, write the batch script; with
``"submit": true`` submit it too), ``submit`` (sbatch / qsub as the user), ``cancel`` (scancel / qdel), ``logs`` (the tails of the job's output
and error logs), ``remove`` (the tree).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any, Mapping

ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
MAX_REQUEST = 64 << 20
ENV_PASSED = ("SLURM_CONF", "PBS_CONF_FILE", "PBS_SERVER", "PATH")     # what sbatch/qsub need of the service's


class AgentError(Exception):
    """A refusal; ``str()`` is the message for the service (and its user)."""


def _check_id(value: Any) -> str:
    if not isinstance(value, str) or not 8 <= len(value) <= 64 or not set(value) <= ID_CHARS:
        raise AgentError(f"bad launcher job id {str(value)[:80]!r}")
    return value


def open_job_root(path: str) -> int:
    """The job root as a directory fd: a real directory (not a symlink), root's, mode 1777 (as
    /tmp: anyone may create, only the owner may remove what they made)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise AgentError(f"launcher.job_root {path}: {exc.strerror} (an admin runs `tether launcher install "
                         f"--apply`)") from None
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o1777 != 0o1777:
        os.close(fd)
        raise AgentError(f"launcher.job_root {path} must be root's with mode 1777 (it is uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):o})")
    return fd


def open_tree(root_fd: int, job: str, root: str) -> int:
    """This user's tree ``<root>/<job>`` as a directory fd, refused unless it is theirs."""
    try:
        fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except FileNotFoundError:
        raise AgentError(f"no job tree {root}/{job}") from None
    except OSError as exc:
        raise AgentError(f"{root}/{job}: {exc.strerror}") from None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise AgentError(f"{root}/{job} is not yours")
    return fd


def _write_at(dir_fd: int, name: str, data: str, mode: int) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
        os.fchmod(fd, mode)
        fh.write(data)


def _stage(files_fd: int, relative: str, data: str) -> None:
    """Write ``relative`` below the open directory ``files_fd``, making its directories."""
    parts = relative.split("/")
    fd = os.dup(files_fd)
    try:
        for part in parts[:-1]:
            if part in ("", ".", "..") or part.startswith("."):
                raise AgentError(f"files: {relative!r} is not a plain relative path")
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if parts[-1] in ("", ".", "..") or parts[-1].startswith("."):
            raise AgentError(f"files: {relative!r} is not a plain relative path")
        _write_at(fd, parts[-1], data, 0o600)
    finally:
        os.close(fd)


def prepare(req: Mapping[str, Any]) -> dict:
    """Make ``<job_root>/<id>`` (0700) with ``files/`` (the staged files: the job's working
    directory), ``job.sh`` (the batch script) and ``spec.json``."""
    root, job = req["job_root"], _check_id(req["id"])
    root_fd = open_job_root(root)
    try:
        try:
            os.mkdir(job, 0o700, dir_fd=root_fd)
        except FileExistsError:
            raise AgentError(f"{root}/{job} exists already") from None
        tree_fd = open_tree(root_fd, job, root)
        try:
            os.mkdir("files", 0o700, dir_fd=tree_fd)
            files_fd = os.open("files", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree_fd)
            try:
                for relative, data in sorted((req.get("files") or {}).items()):
                    _stage(files_fd, relative, data)
            finally:
                os.close(files_fd)
            _write_at(tree_fd, "job.sh", req["script"], 0o700)
            _write_at(tree_fd, "spec.json", json.dumps(req.get("spec") or {}, indent=1) + "\n", 0o600)
        finally:
            os.close(tree_fd)
    finally:
        os.close(root_fd)
    if req.get("submit"):              # one agent run (one sudo, one interpreter) for both
        return {"tree": f"{root}/{job}", **submit(req)}
    return {"tree": f"{root}/{job}"}


def _command_env(req: Mapping[str, Any]) -> dict[str, str]:
    env = {k: str(v) for k, v in (req.get("env") or {}).items() if k in ENV_PASSED}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    import pwd

    entry = pwd.getpwuid(os.getuid())
    env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    return env


def _run(argv: list[str], req: Mapping[str, Any], cwd: str | None = None):
    """sbatch/qsub/scancel/qdel as the user, through tether's one subprocess entry point (in the
    agent's session); an AgentError when it cannot run or does not answer."""
    from ..system.proc import CommandError, run_command

    try:
        return run_command(argv, env=_command_env(req), cwd=cwd, timeout=120, check=False, new_session=False)
    except CommandError as exc:
        if exc.kind == "timeout":
            raise AgentError(f"{argv[0]} did not answer within 120 s") from None
        raise AgentError(f"cannot run {argv[0]} on this host: {exc.reason}") from None


def submit(req: Mapping[str, Any]) -> dict:
    """sbatch (``--parsable``) or qsub the tree's job.sh, from its files/ directory."""
    root, job = req["job_root"], _check_id(req["id"])
    root_fd = open_job_root(root)
    os.close(open_tree(root_fd, job, root))       # the user's own tree, or refused
    os.close(root_fd)
    tree = f"{root}/{job}"
    argv = ["sbatch", "--parsable", f"{tree}/job.sh"] if req.get("scheduler", "slurm") == "slurm" \
        else ["qsub", f"{tree}/job.sh"]
    done = _run(argv, req, cwd=f"{tree}/files")
    if done.returncode != 0:
        raise AgentError(f"{argv[0]} refused the job: {done.stderr.strip() or done.stdout.strip() or done.returncode}")
    job_id = done.stdout.strip().split(";")[0].splitlines()[-1] if done.stdout.strip() else ""
    if not job_id:
        raise AgentError(f"{argv[0]} printed no job id")
    return {"job_id": job_id, "said": done.stderr.strip()}


def cancel(req: Mapping[str, Any]) -> dict:
    job_id = str(req.get("job_id") or "")
    if not job_id or not all(c.isalnum() or c in "._-[]" for c in job_id):
        raise AgentError(f"bad scheduler job id {job_id[:40]!r}")
    argv = ["scancel", job_id] if req.get("scheduler", "slurm") == "slurm" else ["qdel", job_id]
    done = _run(argv, req)
    if done.returncode != 0:
        raise AgentError(f"{argv[0]} {job_id}: {done.stderr.strip() or done.returncode}")
    return {}


def _tail(dir_fd: int, name: str, limit: int) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def logs(req: Mapping[str, Any]) -> dict:
    """The last ``max_bytes`` of job.out and job.err (None: not written yet)."""
    root, job = req["job_root"], _check_id(req["id"])
    limit = max(1, min(int(req.get("max_bytes") or 1 << 20), 16 << 20))
    root_fd = open_job_root(root)
    try:
        tree_fd = open_tree(root_fd, job, root)
    finally:
        os.close(root_fd)
    try:
        return {"out": _tail(tree_fd, "job.out", limit), "err": _tail(tree_fd, "job.err", limit)}
    finally:
        os.close(tree_fd)


def remove(req: Mapping[str, Any]) -> dict:
    """Remove the tree (fd-relative: shutil.rmtree never follows a symlink in it). A name that is
    not the user's tree -- gone, or made since by someone else: a directory, a symlink, a file -- is
    left alone and said so (``removed: false``): the job has nothing there to remove. In the sticky
    job root nobody else can rename or remove the user's own directory between the check and rmtree."""
    import errno
    import shutil

    root, job = req["job_root"], _check_id(req["id"])
    root_fd = open_job_root(root)
    try:
        try:
            tree_fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        except FileNotFoundError:
            return {"removed": False, "left": f"no job tree {root}/{job}"}
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM):
                return {"removed": False, "left": f"{root}/{job}: {exc.strerror} (not this user's tree)"}
            raise
        try:
            owner = os.fstat(tree_fd).st_uid
        finally:
            os.close(tree_fd)
        if owner != os.getuid():
            return {"removed": False, "left": f"{root}/{job} is not yours (uid {owner}'s)"}
        shutil.rmtree(job, dir_fd=root_fd)
    finally:
        os.close(root_fd)
    return {"removed": True}


OPERATIONS = {"prepare": prepare, "submit": submit, "cancel": cancel, "logs": logs, "remove": remove}


def handle(req: Any) -> dict:
    if not isinstance(req, dict) or req.get("op") not in OPERATIONS:
        raise AgentError(f"unknown request (operations: {', '.join(OPERATIONS)})")
    if req["op"] != "cancel" and not (isinstance(req.get("job_root"), str) and req["job_root"].startswith("/")):
        raise AgentError("job_root: an absolute path is needed")
    return OPERATIONS[req["op"]](req)


def main() -> int:
    """``tether-agent``: one request on stdin, one answer on stdout."""
    if len(sys.argv) > 1:
        print("tether-agent takes no arguments: it reads one JSON request on stdin (the launcher runs it "
              "through sudo)", file=sys.stderr)
        return 2
    os.umask(0o077)
    try:
        raw = sys.stdin.buffer.read(MAX_REQUEST + 1)
        if len(raw) > MAX_REQUEST:
            raise AgentError("request too large")
        answer = handle(json.loads(raw.decode("utf-8")))
    except AgentError as exc:
        json.dump({"error": str(exc)}, sys.stdout)
        return 1
    except (ValueError, KeyError, TypeError) as exc:
        json.dump({"error": f"bad request: {type(exc).__name__}: {exc}"}, sys.stdout)
        return 1
    except OSError as exc:
        json.dump({"error": f"{exc.filename or ''}: {exc.strerror}".lstrip(": ")}, sys.stdout)
        return 1
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

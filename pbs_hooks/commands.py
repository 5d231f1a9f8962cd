"""PBS status, nodes and cancel: ``qstat -f -F json``, ``pbsnodes -a -F json``, ``qdel``.

What the rest of tether (the front door, pilot partitions) asks PBS, with timeouts and errors a
caller can act on. Parsing copes with what OpenPBS really prints:

* numbers are bare JSON numbers -- also environment values that look like numbers; the release
  23.06.06 client prints ``00``, ``.5``, ``+5``, ``inf`` bare too (invalid JSON, openpbs#1255;
  recorded, tests/fixtures/pbs/openpbs-qstat-cases.json): any bare value that is not a JSON number,
  true, false or null is read as the string it printed;
* that client also drops an empty value and swallows the next variable into it
  (``"A":",B=x"`` for ``A=,B=x``): split again (``"A":"", "B":"x"``) where B is not a key already;
* its bytes are not always UTF-8 (``é`` printed as ``^C^\xe9``), with raw control characters in
  strings: undecodable bytes are read as U+FFFD, control characters as they are;
* releases before the 2020 fix (openpbs PR #2049) printed PBS's own escapes (``\\,`` ``\\'``)
  inside JSON strings: read as the plain characters;
* a server that cannot be reached still prints ``{"timestamp":…,"pbs_version":…,"pbs_server":…}``
  and exits non-zero with ``qstat: cannot connect to server HOST (errno=15010)``;
* an unknown job id (``qstat: Unknown Job Id ID``), a node PBS does not know
  (``"nodes":{"x":{"Error":"Unknown node "}}``).
Output that stays unreadable (e.g. exported bash functions in ``Variable_List``, openpbs#2541)
raises PBSCommandError naming the command and the position.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from ..hooks.errors import TetherError
from ..system.proc import CommandError, run_command

from .mom import job_hosts

DEFAULT_TIMEOUT = 30.0
JOB_STATES = {"B": "begun", "E": "exiting", "F": "finished", "H": "held", "M": "moved", "Q": "queued",
              "R": "running", "S": "suspended", "T": "transit", "U": "suspended", "W": "waiting",
              "X": "expired"}


class PBSCommandError(TetherError):
    """A PBS command failed; ``kind``: unreachable, unknown_job, finished, missing, timeout, failed,
    bad_output. ``transient`` when trying again later may work."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind

    @property
    def transient(self) -> bool:
        return self.kind in ("unreachable", "timeout")


class JobStatus:
    """One job of ``qstat -f -F json``: the fields tether uses, and everything in ``attrs``."""

    def __init__(self, job_id: str, attrs: dict[str, Any]):
        self.job_id = job_id
        if isinstance(attrs.get("Variable_List"), dict):
            attrs = {**attrs, "Variable_List": split_swallowed(attrs["Variable_List"])}
        else:
            attrs = {**attrs, "Variable_List": {}}
        self.attrs = attrs
        self.name = str(attrs.get("Job_Name", ""))
        self.owner = str(attrs.get("Job_Owner", "")).split("@", 1)[0]
        self.state_code = str(attrs.get("job_state", ""))
        self.state = JOB_STATES.get(self.state_code, "unknown")
        self.queue = str(attrs.get("queue", ""))
        exit_status = attrs.get("Exit_status")
        self.exit_status = int(exit_status) if str(exit_status).lstrip("-").isdigit() else None
        self.hosts = tuple(job_hosts(attrs.get("exec_host")))
        self.resources = dict(attrs.get("Resource_List") or {})
        self.variables = {k: str(v) for k, v in attrs.get("Variable_List", {}).items()}
        self.comment = str(attrs.get("comment", ""))

    def __repr__(self) -> str:
        return f"JobStatus({self.job_id!r}, state={self.state!r}, exit_status={self.exit_status!r})"


class NodeStatus:
    """One node of ``pbsnodes -a -F json``."""

    def __init__(self, name: str, attrs: dict[str, Any]):
        self.name = name
        self.attrs = attrs
        self.states = tuple(s for s in str(attrs.get("state", "")).split(",") if s)
        self.available = dict(attrs.get("resources_available") or {})
        self.assigned = dict(attrs.get("resources_assigned") or {})
        self.jobs = tuple(dict.fromkeys(str(j).split("/", 1)[0] for j in attrs.get("jobs") or ()))
        self.comment = str(attrs.get("comment", ""))

    @property
    def usable(self) -> bool:
        """Up and accepting work (free, or busy with jobs): not down, offline, unknown, stale."""
        bad = {"down", "offline", "unknown", "stale", "state-unknown", "unresolvable", "maintenance"}
        return bool(self.states) and not bad.intersection(self.states)

    @property
    def gpus(self) -> int:
        try:
            return int(self.available.get("ngpus", 0))
        except (TypeError, ValueError):
            return 0

    def __repr__(self) -> str:
        return f"NodeStatus({self.name!r}, states={self.states!r})"


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SWALLOWED = re.compile(r",([A-Za-z_][A-Za-z0-9_]*)=")


def split_swallowed(variables: dict[str, Any]) -> dict[str, Any]:
    """``Variable_List`` with the pairs the release 23.06.06 client swallowed into an empty value
    (``"A":",B=x,C=y"``...) split out again -- only when the name is not a key already."""
    out: dict[str, Any] = {}
    for key, value in variables.items():
        while isinstance(value, str) and (m := _SWALLOWED.match(value)) and m.group(1) not in variables \
                and m.group(1) not in out:
            out[key] = ""
            key, value = m.group(1), value[m.end():]
        out[key] = value
    return out


def _repair(text: str) -> str:
    """Make OpenPBS's almost-JSON parseable (see the module doc): inside strings, an escape JSON
    does not know loses its backslash; outside, a bare value that is not a JSON number (``005``)
    becomes a string."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':                                   # a string: copy it, fixing escapes
            j = i + 1
            out.append('"')
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    out.append(text[j:j + 2] if nxt in '"\\/bfnrtu' else nxt)
                    j += 2
                    continue
                out.append(text[j])
                j += 1
            out.append('"')
            i = j + 1
        elif c not in "{}[]:, \t\r\n":                 # a bare value: keep it if JSON knows it
            j = i
            while j < n and text[j] not in ",}] \t\r\n":
                j += 1
            token = text[i:j]
            if token in ("true", "false", "null") or _JSON_NUMBER.fullmatch(token):
                out.append(token)
            else:
                out.append(json.dumps(token))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_json(text: str, what: str) -> dict[str, Any]:
    """The JSON document a PBS command printed (repaired when needed)."""
    try:
        return json.loads(text, strict=False)
    except ValueError:
        pass
    try:
        return json.loads(_repair(text), strict=False)
    except ValueError as exc:
        raise PBSCommandError(f"{what} printed output tether cannot read ({exc}); the first 200 "
                              f"characters: {text[:200]!r}", "bad_output") from None


def _run(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) through tether's one subprocess entry point; bytes that are not
    UTF-8 read as U+FFFD (the release 23.06.06 qstat prints some), the command killed with its
    session at ``timeout``."""
    try:
        done = run_command(argv, timeout=timeout, env=env, check=False, errors="replace")
    except CommandError as exc:
        if exc.kind == "timeout":
            raise PBSCommandError(f"{' '.join(argv)} did not answer within {timeout:g} s", "timeout") from None
        raise PBSCommandError(f"{argv[0]} is not available here: {exc.reason}", "missing") from None
    return done.stdout, done.stderr, done.returncode


def _failure(argv: list[str], stderr: str, code: int) -> PBSCommandError:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = "; ".join(lines) or f"exit code {code}"
    if any("cannot connect to server" in line for line in lines):
        return PBSCommandError(f"{argv[0]}: the PBS server cannot be reached ({text})", "unreachable")
    if any("Unknown Job Id" in line for line in lines):
        return PBSCommandError(text, "unknown_job")
    if any("Job has finished" in line for line in lines):
        return PBSCommandError(text, "finished")
    return PBSCommandError(f"{' '.join(argv)} failed: {text}", "failed")


def job_status(job_ids: Sequence[str] = (), *, history: bool = True, timeout: float = DEFAULT_TIMEOUT,
               qstat: str = "qstat", env: Mapping[str, str] | None = None) -> dict[str, JobStatus]:
    """``qstat -f -F json [-x] [ID…]``: job id -> status (all visible jobs when no id is given).
    ``history`` adds finished jobs (-x; the server keeps them only with job_history_enable).
    Ids PBS does not know are left out; if none is known, PBSCommandError(kind="unknown_job");
    a finished job asked for without ``history``: kind="finished". tether's one reader of qstat:
    the launcher, the pilot and ``tether pbs status`` use it."""
    argv = [qstat, "-f", "-F", "json", *(["-x"] if history else []), *job_ids]
    stdout, stderr, code = _run(argv, timeout, env)
    unknown = [line for line in stderr.splitlines() if "Unknown Job Id" in line]
    if code != 0 and not (unknown and stdout.strip()):
        raise _failure(argv, stderr, code)
    doc = parse_json(stdout, "qstat") if stdout.strip() else {}
    jobs = {job_id: JobStatus(job_id, attrs) for job_id, attrs in (doc.get("Jobs") or {}).items()
            if isinstance(attrs, dict)}
    if job_ids and not jobs and unknown:
        raise PBSCommandError("; ".join(line.strip() for line in unknown), "unknown_job")
    return jobs


def node_status(*, timeout: float = DEFAULT_TIMEOUT, pbsnodes: str = "pbsnodes") -> dict[str, NodeStatus]:
    """``pbsnodes -a -F json``: node name -> status (entries PBS reports as errors left out)."""
    argv = [pbsnodes, "-a", "-F", "json"]
    stdout, stderr, code = _run(argv, timeout)
    if code != 0:
        raise _failure(argv, stderr, code)
    doc = parse_json(stdout, "pbsnodes")
    return {name: NodeStatus(name, attrs) for name, attrs in (doc.get("nodes") or {}).items()
            if isinstance(attrs, dict) and "Error" not in attrs}


def cancel(job_id: str, *, force: bool = False, timeout: float = DEFAULT_TIMEOUT, qdel: str = "qdel") -> bool:
    """``qdel [-W force] ID``: True when PBS took the request, False when the job had already
    finished or is unknown (nothing left to cancel); PBSCommandError otherwise."""
    argv = [qdel, *(["-W", "force"] if force else []), job_id]
    _, stderr, code = _run(argv, timeout)
    if code == 0:
        return True
    error = _failure(argv, stderr, code)
    if error.kind in ("unknown_job", "finished"):
        return False
    raise error

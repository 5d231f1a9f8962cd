"""A stub of OpenPBS's ``pbs`` hook module, for running tether's real hook files in tests.

Faithful where tether depends on it (../shared/DESIGN.md, PBS section):
- ``event().accept()`` and ``event().reject(msg)`` end the hook by raising ``SystemExit``;
- ``select``/``place`` are validated strings (a malformed one raises ``BadAttributeValueError``);
- each event type may change only some job attributes: anything else raises
  ``BadAttributeValueError`` as PBS does ("... cannot be modified in this event");
- ``Resource_List`` gives ``None`` for what the user did not ask for (queuejob sees no defaults);
- ``logmsg`` levels, ``hook_config_filename``, ``server().queue(name)``, ``get_local_nodename()``;
- MoM events: ``execjob_launch`` alone has ``env``, ``progname`` and ``argv`` (other events raise when
  a hook sets them); ``env`` is OpenPBS's ``pbs_env``: PBS's own variables (``PBS_JOBID``, ``TMPDIR``,
  ``PBS_O_*``, ...) are read-only, a backslash not already escaping ``, ' " \\`` is doubled on
  assignment, and the task gets the values with those escapes removed (``task_env()``), the
  variables being joined with commas -- an unescaped comma in a value splits it (as in PBS).
  The stub lets MoM hooks change no job attribute (tether's do not try).
Tests set up an event with ``stub_event(...)`` and read what the hook did from the returned objects.
"""

from __future__ import annotations

import re

QUEUEJOB, MODIFYJOB, RUNJOB = 1, 2, 4
EXECJOB_BEGIN, EXECJOB_LAUNCH, EXECJOB_END, EXECJOB_ABORT = 64, 2048, 256, 8192
LOG_DEBUG, LOG_WARNING, LOG_ERROR, EVENT_DEBUG = 4, 32, 64, 256

hook_config_filename: str | None = None
LOG: list[tuple[int, str]] = []
_EVENT = None
_QUEUES = ("workq",)


class BadAttributeValueError(Exception):
    pass


class BadResourceValueError(Exception):
    pass


class select(str):
    """``N:res=val:...`` chunks joined by ``+``, as PBS validates them."""

    def __new__(cls, value: str):
        for chunk in str(value).split("+"):
            parts = chunk.split(":")
            first = parts[0]
            rest = parts[1:] if first.isdigit() else parts
            if not chunk or (not first.isdigit() and "=" not in first):
                raise BadAttributeValueError(f"illegal select value {value!r}")
            for part in rest:
                name, eq, val = part.partition("=")
                if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not val:
                    raise BadAttributeValueError(f"illegal select value {value!r}")
        return super().__new__(cls, value)


class place(str):
    ARRANGEMENTS = ("free", "pack", "scatter", "vscatter")
    SHARING = ("excl", "shared", "exclhost")

    def __new__(cls, value: str):
        for part in str(value).split(":"):
            if part not in cls.ARRANGEMENTS + cls.SHARING and not part.startswith("group="):
                raise BadAttributeValueError(f"illegal place value {value!r}")
        return super().__new__(cls, value)


class size(str):
    def __new__(cls, value):
        if not re.fullmatch(r"\d+[kmgtp]?[bw]?", str(value).lower()):
            raise BadAttributeValueError(f"illegal size {value!r}")
        return super().__new__(cls, value)


class duration(str):
    def __new__(cls, value):
        if not re.fullmatch(r"(\d+:){0,2}\d+", str(value)):
            raise BadAttributeValueError(f"illegal duration {value!r}")
        return super().__new__(cls, value)


class queue:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return self.name


class _Server:
    def queue(self, name: str) -> queue:
        if name not in _QUEUES:
            raise BadAttributeValueError(f"unknown queue {name!r}")
        return queue(name)


def server() -> _Server:
    return _Server()


class pbs_resource(dict):
    """Resource_List: missing resources read as None; select/place must be their types."""

    def __getitem__(self, key):
        return self.get(key)

    def __setitem__(self, key, value):
        if key == "select" and value is not None and not isinstance(value, select):
            raise BadResourceValueError("Resource_List['select'] must be a pbs.select")
        if key == "place" and value is not None and not isinstance(value, place):
            raise BadResourceValueError("Resource_List['place'] must be a pbs.place")
        super().__setitem__(key, value)


# Which job attributes each event may change (OpenPBS hook guide, "attributes modifiable by hooks").
_WRITABLE = {
    QUEUEJOB: {"Resource_List", "queue", "Rerunable", "umask", "project", "comment", "Variable_List",
               "Job_Name", "Account_Name"},
    MODIFYJOB: {"Resource_List", "Rerunable", "umask", "project", "comment", "Variable_List", "Job_Name",
                "Account_Name"},
}


class job:
    def __init__(self, event_type: int, **attrs):
        object.__setattr__(self, "_event_type", event_type)
        object.__setattr__(self, "_changed", set())
        defaults = {"id": "", "queue": "", "Resource_List": pbs_resource(), "Rerunable": None, "umask": None,
                    "project": None, "comment": None, "Variable_List": {}, "Account_Name": None,
                    "euser": None, "egroup": None, "exec_host": None}
        defaults.update(attrs)
        for key, value in defaults.items():
            object.__setattr__(self, key, value)
        rl = pbs_resource()
        for key, value in dict(self.Resource_List).items():
            dict.__setitem__(rl, key, value)
        object.__setattr__(self, "Resource_List", rl)

    def __setattr__(self, key, value):
        if key not in _WRITABLE.get(self._event_type, set()):
            raise BadAttributeValueError(f"job attribute {key!r} cannot be modified in this event")
        if key == "queue" and not isinstance(value, queue):
            raise BadAttributeValueError("job.queue must be a pbs queue object (pbs.server().queue(name))")
        self._changed.add(key)
        object.__setattr__(self, key, value)


class _Event:
    _LAUNCH_ONLY = ("env", "progname", "argv")

    def __init__(self, event_type: int, job_obj: job, requestor: str, job_o: job | None):
        self.type = event_type
        self.job = job_obj
        self.job_o = job_o
        self.requestor = requestor
        self.accepted = None
        self.reject_msg = None
        if event_type == EXECJOB_LAUNCH:
            self.env, self.progname, self.argv = pbs_env(), "", []

    def __setattr__(self, key, value):
        if key in self._LAUNCH_ONLY and self.__dict__.get("type") != EXECJOB_LAUNCH:
            raise BadAttributeValueError(f"event attribute {key!r} exists only in execjob_launch")
        if key == "env" and not isinstance(value, pbs_env):
            raise BadAttributeValueError("event env must stay a pbs_env")
        if key == "argv" and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
            raise BadAttributeValueError("event argv must be a list of strings")
        object.__setattr__(self, key, value)

    def accept(self):
        self.accepted = True
        raise SystemExit(0)

    def reject(self, msg: str = ""):
        self.accepted = False
        self.reject_msg = msg
        raise SystemExit(0)


class pbs_env(dict):
    """``e.env`` of execjob_launch (OpenPBS's pbs_env; see the module doc)."""

    READONLY = ("PBS_ENVIRONMENT", "PBS_JOBDIR", "PBS_JOBID", "PBS_JOBNAME", "PBS_NODEFILE", "TMPDIR",
                "PBS_O_HOME", "PBS_O_HOST", "PBS_O_LANG", "PBS_O_LOGNAME", "PBS_O_MAIL", "PBS_O_PATH",
                "PBS_O_QUEUE", "PBS_O_SHELL", "PBS_O_SYSTEM", "PBS_O_TZ", "PBS_O_WORKDIR", "PBS_QUEUE")
    SPECIAL = ",'\"\\"

    @classmethod
    def from_plain(cls, values: dict) -> "pbs_env":
        """The env MoM hands the hook for a task environment ``values`` (escaped as PBS stores it)."""
        env = cls()
        for name, value in values.items():
            dict.__setitem__(env, name, "".join("\\" + c if c in cls.SPECIAL else c for c in value))
        return env

    def __setitem__(self, name, value):
        if name in self.READONLY:
            raise BadAttributeValueError(f"env variable '{name}' is readonly")
        value = str(value)
        out = []
        for i, c in enumerate(value):
            escaped_pair = i > 0 and value[i - 1] == "\\" and c in self.SPECIAL
            before_special = i + 1 < len(value) and value[i + 1] in self.SPECIAL
            out.append(c if c != "\\" or escaped_pair or before_special else "\\\\")
        super().__setitem__(name, "".join(out))

    def task_env(self) -> dict:
        """What the task gets: the variables joined with commas, split again at unescaped commas,
        and the escapes removed."""
        text = ",".join(f"{k}={v}" for k, v in self.items())
        items, cur, i = [], [], 0
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text):
                cur.append(text[i:i + 2])
                i += 2
                continue
            if text[i] == ",":
                items.append("".join(cur))
                cur = []
            else:
                cur.append(text[i])
            i += 1
        items.append("".join(cur))
        env = {}
        for item in items:
            name, _, value = item.partition("=")
            plain, j = [], 0
            while j < len(value):
                if value[j] == "\\" and j + 1 < len(value) and value[j + 1] in self.SPECIAL:
                    j += 1
                plain.append(value[j])
                j += 1
            env[name] = "".join(plain)
        return env


_LOCAL_NODE = "localhost"


def get_local_nodename() -> str:
    return _LOCAL_NODE


def event() -> _Event:
    assert _EVENT is not None, "stub_event() first"
    return _EVENT


def logmsg(level: int, msg: str) -> None:
    LOG.append((level, str(msg)))


def stub_event(event_type: int, *, resources: dict | None = None, requestor: str = "alice",
               config_file: str | None = None, queues=("workq",), original: dict | None = None,
               env: dict | None = None, progname: str = "", argv: list | None = None,
               local_node: str = "localhost", original_variables: dict | None = None, **attrs) -> _Event:
    """Set up the event a hook run will see (original/original_variables: the job before qalter,
    for modifyjob;
    env/progname/argv: the task execjob_launch is about to start, env as plain values)."""
    global _EVENT, hook_config_filename, _QUEUES, _LOCAL_NODE
    LOG.clear()
    _QUEUES = tuple(queues)
    _LOCAL_NODE = local_node
    hook_config_filename = config_file
    attrs_o = {**attrs, **({"Variable_List": original_variables} if original_variables is not None else {})}
    job_o = job(0, Resource_List=dict(original or {}), **attrs_o) if original is not None else None
    _EVENT = _Event(event_type, job(event_type, Resource_List=dict(resources or {}), **attrs), requestor, job_o)
    if event_type == EXECJOB_LAUNCH:
        object.__setattr__(_EVENT, "env", pbs_env.from_plain(env or {}))
        object.__setattr__(_EVENT, "progname", progname)
        object.__setattr__(_EVENT, "argv", list(argv or []))
    return _EVENT

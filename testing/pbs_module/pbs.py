"""A stand-in for OpenPBS's ``pbs`` hook module, as strict as the real one where tether touches it.

Put this directory first on ``sys.path`` (``tether.testing.PBS_MODULE_DIR``), set up an event with
``stub_event(...)``, run a hook file as PBS does (``tether.testing.pbs.run_hook``) and read what the
hook did from the returned objects. Each behaviour follows OpenPBS 23.06 (``src/modules/python/pbs/v1``
and ``src/lib/Libpython``, cited below by file) or what a real server did on a machine of this kind
(docs/requirements.md, "Facts verified against real programs"):

- ``Resource_List[name]`` is ``getattr`` (_base_types.py ``pbs_resource.__getitem__``): a resource
  the server does not define raises **AttributeError** -- a stock server has no ``ngpus`` until an
  admin creates it; one it defines that the job did not ask for is ``None``. Setting an undefined
  one raises ``UnsetResourceNameError`` in a server hook and is allowed in a MoM hook
  (``pbs_resource.__setattr__``); names match case-insensitively on set; ``keys()`` lists the
  resources that have a value.
- Values have the server's types (pbs_python_svr_internal.c ``pbs_python_setup_resc_get_value_type``;
  _export_types.py): ``select`` and ``place`` are ``pbs.select``/``pbs.place`` -- **not** ``str``
  (``_generic_attr``: compare with ``str()``); a ``long`` resource is ``pbs.pbs_int``, a ``string``
  one ``pbs.pbs_str``, ``size`` is ``pbs.size``, ``time`` is ``pbs.duration`` (an int of seconds). A
  value set from a hook is converted to the resource's type (_base_types.py
  ``PbsAttributeDescriptor.__set__``), so a malformed one raises there.
- With a queuejob hook enabled, a malformed value of a custom resource (``-l tether_slots=abc``) is
  silently dropped: the hook sees ``None`` (seen on a real server).
- ``e.accept()`` / ``e.reject(msg)`` end the hook by raising ``SystemExit`` (_svr_types.py
  ``event.accept``/``reject``); after either, the event's job may not be changed any more.
- ``e.<name>`` that the event type does not have raises ``EventIncompatibleError`` (an
  AttributeError; _svr_types.py ``event.__getattr__``): ``job_o`` exists in modifyjob only; ``env``,
  ``progname``, ``argv`` in execjob_launch only.
- Each event type may change only some job attributes; anything else raises
  ``BadAttributeValueError`` ("... cannot be modified in this event"; PBS hook guide).
- ``e.env`` of execjob_launch is a ``pbs_env`` (_base_types.py): PBS's own variables are read-only, a
  backslash not already escaping ``, ' " \\`` is doubled on assignment, and the task gets the values
  with those escapes removed (``task_env()``), joined with commas -- an unescaped comma splits a value.
- MoM events hand the hook what a real MoM does (recorded on OpenPBS 23.06.06, cases
  ``hook-execjob_begin-view``, ``hook-execjob_launch-*``, ``hook-two-chunks-one-host`` in
  tests/fixtures/pbs/openpbs-mom-cases.json): ``job.exec_host`` is **None** -- the placement is in
  ``exec_vnode``, ``exec_host2`` (``host:port/index[*ncpus]`` per chunk) and ``schedselect``;
  ``Resource_List`` has no ``select``/``nodect``/``mpiprocs``. ``stub_event`` refuses a MoM event
  set up otherwise, and a launch ``env`` PBS never gives: ``PBS_VNODENUM`` (Torque's), a TM task
  (non-empty argv) with ``PBS_NODEFILE`` or a ``PBS_TASKNUM`` that is not 8 upper-case hex digits,
  a job shell whose ``PBS_TASKNUM`` is not ``1``. What a job's own TM client can put into a task's
  environment (tm_spawn's envp, applied after PBS's own variables) goes in ``job_set``.
  ``tether.testing.pbs.MomJob`` builds these events for a job on several hosts.
Module state (the event, the log, the defined resources) is reset by ``stub_event``; a hook run in
the same interpreter again sees the new event, as in pbs_server's persistent interpreter.
"""

from __future__ import annotations

import re

QUEUEJOB, MODIFYJOB, RESVSUB, MOVEJOB, RUNJOB = 1, 2, 4, 8, 16
EXECJOB_BEGIN, EXECJOB_PROLOGUE, EXECJOB_EPILOGUE, EXECJOB_END = 64, 128, 256, 512
EXECJOB_LAUNCH, EXECJOB_ABORT = 2048, 8192
LOG_DEBUG, LOG_WARNING, LOG_ERROR, EVENT_DEBUG, EVENT_ERROR = 4, 32, 64, 256, 1

hook_config_filename: str | None = None
LOG: list[tuple[int, str]] = []
_EVENT = None
_QUEUES = ("workq",)
_LOCAL_NODE = "localhost"
_DAEMON = "server"


# ---- exceptions (_exc_types.py) ------------------------------------------------------------
class EventIncompatibleError(AttributeError):
    pass


class UnsetAttributeNameError(Exception):
    pass


class BadAttributeValueTypeError(Exception):
    pass


class BadAttributeValueError(Exception):
    pass


class UnsetResourceNameError(Exception):
    pass


class BadResourceValueTypeError(Exception):
    pass


class BadResourceValueError(Exception):
    pass


# ---- value types (_base_types.py) ----------------------------------------------------------
class _generic_attr:
    """A PBS value that is not a ``str``: ``str(value)`` gives its text; ``==`` is identity, as in
    the real class (it defines no comparison)."""

    def __init__(self, value):
        self._value = value if isinstance(value, (str, _generic_attr)) else str(value)

    def __str__(self) -> str:
        return str(self._value)

    __repr__ = __str__


_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"


class select(_generic_attr):
    """``[N:]res=val[:res=val][+...]``, validated as the server's ``select`` resource is."""

    def __init__(self, value):
        text = str(value)
        for chunk in text.split("+"):
            parts = chunk.split(":")
            count = parts[0].isascii() and parts[0].isdigit()
            rest = parts[1:] if count else parts
            if not chunk or (count and int(parts[0]) == 0):
                raise BadAttributeValueError(f"illegal select value '{text}'")
            for part in rest:
                name, eq, val = part.partition("=")
                if not eq or not re.fullmatch(_NAME, name) or not val:
                    raise BadAttributeValueError(f"illegal select value '{text}'")
        super().__init__(text)


class place(_generic_attr):
    """``[arrangement]:[sharing]:[group=res]`` in any order."""

    ARRANGEMENTS = ("free", "pack", "scatter", "vscatter")
    SHARING = ("excl", "shared", "exclhost")

    def __init__(self, value):
        text = str(value)
        for part in text.split(":"):
            if part not in self.ARRANGEMENTS + self.SHARING and not re.fullmatch(r"group=" + _NAME, part):
                raise BadAttributeValueError(f"illegal place value '{text}'")
        super().__init__(text)


class size(_generic_attr):
    def __init__(self, value):
        if not re.fullmatch(r"[0-9]+([kmgtp]?[bw]?)", str(value).lower()):
            raise BadAttributeValueError(f"illegal size value '{value}'")
        super().__init__(str(value))


class duration(int):
    """``[[H:]M:]S`` as seconds; ``str()`` gives the text it was made from."""

    def __new__(cls, value):
        text = str(value)
        if not re.fullmatch(r"([0-9]+:){0,2}[0-9]+(\.[0-9]+)?", text):
            raise BadAttributeValueError(f"illegal duration value '{text}'")
        seconds = 0
        for part in text.split(".")[0].split(":"):
            seconds = seconds * 60 + int(part)
        obj = int.__new__(cls, seconds)
        obj.duration_str = text
        return obj

    def __str__(self) -> str:
        return self.duration_str


class pbs_int(int):
    def __new__(cls, value):
        text = str(value).strip()
        if isinstance(value, bool) or not re.fullmatch(r"[+-]?[0-9]+", text):
            raise BadAttributeValueError(f"illegal integer value '{value}'")
        return int.__new__(cls, int(text))


class pbs_str(str):
    pass


class pbs_float(float):
    pass


class pbs_bool(_generic_attr):
    def __init__(self, value):
        if value in ("true", "True", "TRUE", "t", "T", "y", "1", 1):
            v = 1
        elif value in ("false", "False", "FALSE", "f", "F", "n", "0", 0):
            v = 0
        else:
            raise BadAttributeValueError(f"illegal boolean value '{value}'")
        super().__init__(str(v))

    def __bool__(self) -> bool:
        return str(self) == "1"


class name(_generic_attr):
    pass


class project(_generic_attr):
    pass


class exec_host(_generic_attr):
    pass


class exec_vnode(_generic_attr):
    pass


# Resource definitions: the builtins of src/lib/Libattr/master_resc_def_all.xml (name -> type), and
# the custom resources `tether pbs install` creates. A resource outside this table is "not defined
# on this server": reading it raises AttributeError.
_TYPES = {"long": pbs_int, "string": pbs_str, "size": size, "time": duration, "boolean": pbs_bool,
          "float": pbs_float, "select": select, "place": place}
BUILTIN_RESOURCES = {
    "cput": "time", "mem": "size", "walltime": "time", "soft_walltime": "time", "min_walltime": "time",
    "max_walltime": "time", "ncpus": "long", "select": "select", "place": "place", "nodes": "string",
    "nodect": "long", "arch": "string", "mpiprocs": "long", "ompthreads": "long", "cpupercent": "long",
    "energy": "float", "file": "size", "pmem": "size", "vmem": "size", "pvmem": "size", "nice": "long",
    "pcput": "time", "nodemask": "string", "hpm": "long", "ssinodes": "long", "host": "string",
    "vnode": "string", "software": "string", "site": "string", "partition": "string", "hbmem": "size",
}
# what `tether pbs install` creates (tether.admin.pbs: type=string, flag=m; the counts too, so that a
# malformed count reaches the hook instead of being dropped)
TETHER_RESOURCES = {"tether_slots": "string", "tether_slots_per_node": "string", "tether_slot_type": "string",
                    "tether_gpu_type": "string"}
_DEFINED: dict[str, str] = {}


def define_resources(custom: dict[str, str] | None = None) -> None:
    """The resources this stand-in server defines: the builtins plus ``custom`` (name -> type); by
    default tether's own, as after ``tether pbs install``. Pass e.g. ``{"ngpus": "long", **TETHER_RESOURCES}``
    for a server whose admin created ``ngpus``."""
    _DEFINED.clear()
    _DEFINED.update(BUILTIN_RESOURCES)
    _DEFINED.update(TETHER_RESOURCES if custom is None else custom)


define_resources()


def _convert(resource: str, value):
    """``value`` as the resource's type (None and "" unset it), as the descriptor's ``__set__``."""
    if value is None or value == "":
        return None
    kind = _TYPES[_DEFINED.get(resource, "string")]
    return value if isinstance(value, kind) else kind(value)


class pbs_resource:
    """A job's ``Resource_List`` (see the module doc). Only names in the defined table exist."""

    def __init__(self, values: dict | None = None, *, daemon: str = "server"):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_daemon", daemon)
        object.__setattr__(self, "_frozen", False)
        for key, value in (values or {}).items():
            self._values[self._defined_name(key) or key] = value

    @staticmethod
    def _defined_name(name: str) -> str | None:
        for known in _DEFINED:
            if known.lower() == str(name).lower():
                return known
        return None

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in _DEFINED and name not in self._values:
            raise AttributeError(f"'pbs_resource' object has no attribute '{name}'")
        return self._values.get(name)

    def __setattr__(self, name: str, value) -> None:
        if self._frozen:
            raise BadAttributeValueError("the job cannot be changed after the event was accepted or rejected")
        known = self._defined_name(name)
        if known is None:
            if self._daemon == "server":
                raise UnsetResourceNameError(f"resource attribute '{name}' not found")
            known = name                         # a MoM hook may add a resource
        self._values[known] = _convert(known, value)

    def __getitem__(self, name: str):
        return getattr(self, name)

    def __setitem__(self, name: str, value) -> None:
        setattr(self, name, value)

    def __contains__(self, name: str) -> bool:
        return hasattr(self, name)

    def keys(self) -> list[str]:
        return [k for k, v in self._values.items() if v is not None]

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self._values.items() if v is not None)


def _submitted(values: dict | None, daemon: str) -> pbs_resource:
    """Resource_List as the server hands a hook a request: each value in its resource's type; a
    malformed value of a custom resource is dropped (the hook sees None; seen on a real
    server: docs/requirements.md); a malformed builtin one is refused by qsub before any hook runs
    (raised here)."""
    typed = {}
    for key, value in (values or {}).items():
        known = pbs_resource._defined_name(key)
        if known is None:
            if daemon == "server":
                raise UnsetResourceNameError(f"qsub: Unknown resource {key}")
            typed[key] = value
            continue
        try:
            typed[known] = _convert(known, value)
        except BadAttributeValueError:
            if known in BUILTIN_RESOURCES:
                raise
            typed[known] = None
    return pbs_resource(typed, daemon=daemon)


# ---- server objects ------------------------------------------------------------------------
class queue:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return self.name


class _Server:
    def queue(self, name: str) -> queue:
        if name not in _QUEUES:
            raise BadAttributeValueError(f"unknown queue '{name}'")
        return queue(name)


def server() -> _Server:
    return _Server()


# Which job attributes each event may change (PBS hook guide, "attributes modifiable by hooks"), and
# the type a value set there is converted to (_export_types.py; pbs_python_svr_internal.c).
_WRITABLE = {
    QUEUEJOB: {"Resource_List", "queue", "Rerunable", "umask", "project", "comment", "Variable_List",
               "Job_Name", "Account_Name"},
    MODIFYJOB: {"Resource_List", "Rerunable", "umask", "project", "comment", "Variable_List", "Job_Name",
                "Account_Name"},
}
_ATTR_TYPES = {"Rerunable": pbs_bool, "umask": pbs_int, "project": project, "Job_Name": name,
               "Account_Name": pbs_str, "comment": pbs_str, "euser": pbs_str, "egroup": pbs_str,
               "exec_host": exec_host, "exec_vnode": exec_vnode}


class job:
    def __init__(self, event_type: int, daemon: str = "server", **attrs):
        object.__setattr__(self, "_event_type", event_type)
        object.__setattr__(self, "_changed", set())
        object.__setattr__(self, "_frozen", False)
        defaults = {"id": "", "queue": "", "Rerunable": None, "umask": None, "project": None, "comment": None,
                    "Variable_List": {}, "Account_Name": None, "Job_Name": None, "euser": None, "egroup": None,
                    "exec_host": None, "exec_vnode": None, "exec_host2": None, "schedselect": None,
                    "job_state": None}
        defaults.update(attrs)
        for key, value in defaults.items():
            if key == "Resource_List":
                continue
            kind = _ATTR_TYPES.get(key)
            object.__setattr__(self, key, kind(value) if kind and value is not None else value)
        object.__setattr__(self, "Resource_List", _submitted(attrs.get("Resource_List"), daemon))

    def __setattr__(self, key, value):
        if self._frozen:
            raise BadAttributeValueError("the job cannot be changed after the event was accepted or rejected")
        if key not in _WRITABLE.get(self._event_type, set()):
            raise BadAttributeValueError(f"job attribute '{key}' cannot be modified in this event")
        if key == "queue" and not isinstance(value, queue):
            raise BadAttributeValueError("job.queue must be a pbs queue object (pbs.server().queue(name))")
        kind = _ATTR_TYPES.get(key)
        if kind is not None and value is not None and not isinstance(value, kind):
            value = kind(value)
        self._changed.add(key)
        object.__setattr__(self, key, value)

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)
        object.__setattr__(self.Resource_List, "_frozen", True)


# The parameters each event type has (_svr_types.py: _event.__getattr__ raises EventIncompatibleError
# for any other; the C side fills _param per event).
_PARAMS = {QUEUEJOB: {"job"}, MODIFYJOB: {"job", "job_o"}, RUNJOB: {"job"},
           EXECJOB_BEGIN: {"job", "vnode_list"}, EXECJOB_END: {"job", "vnode_list"},
           EXECJOB_ABORT: {"job", "vnode_list"}, EXECJOB_LAUNCH: {"job", "vnode_list", "env", "progname", "argv"}}


class _Event:
    def __init__(self, event_type: int, params: dict, requestor: str):
        object.__setattr__(self, "type", event_type)
        object.__setattr__(self, "requestor", requestor)
        object.__setattr__(self, "hook_name", "")
        object.__setattr__(self, "_param", params)
        object.__setattr__(self, "accepted", None)
        object.__setattr__(self, "reject_msg", None)

    def __getattr__(self, key):
        try:
            return self._param[key]
        except KeyError:
            raise EventIncompatibleError(f'"{key}" not found in self._param') from None

    def __setattr__(self, key, value):
        if key not in self._param or key in ("job", "job_o", "vnode_list"):
            raise BadAttributeValueError(f"event attribute '{key}' cannot be set in this event")
        if self.accepted is not None:
            raise BadAttributeValueError("the event cannot be changed after accept() or reject()")
        if key == "env" and not isinstance(value, pbs_env):
            raise BadAttributeValueError("event env must stay a pbs_env")
        if key == "argv" and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
            raise BadAttributeValueError("event argv must be a list of strings")
        self._param[key] = value

    def _end(self, accepted: bool, msg: str | None) -> None:
        object.__setattr__(self, "accepted", accepted)
        object.__setattr__(self, "reject_msg", msg)
        for key in ("job", "job_o"):
            if key in self._param and self._param[key] is not None:
                self._param[key]._freeze()

    def accept(self, ecode=0):
        self._end(True, None)
        raise SystemExit(str(ecode))

    def reject(self, emsg="", ecode=255):
        self._end(False, str(emsg))
        raise SystemExit(str(ecode))


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
        for key, value in values.items():
            dict.__setitem__(env, key, "".join("\\" + c if c in cls.SPECIAL else c for c in value))
        return env

    def __setitem__(self, key, value):
        if key in self.READONLY:
            raise BadAttributeValueError(f"env variable '{key}' is readonly")
        value = str(value)
        out = []
        for i, c in enumerate(value):
            escaped_pair = i > 0 and value[i - 1] == "\\" and c in self.SPECIAL
            before_special = i + 1 < len(value) and value[i + 1] in self.SPECIAL
            out.append(c if c != "\\" or escaped_pair or before_special else "\\\\")
        super().__setitem__(key, "".join(out))

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
            key, _, value = item.partition("=")
            plain, j = [], 0
            while j < len(value):
                if value[j] == "\\" and j + 1 < len(value) and value[j + 1] in self.SPECIAL:
                    j += 1
                plain.append(value[j])
                j += 1
            env[key] = "".join(plain)
        return env


def get_local_nodename() -> str:
    return _LOCAL_NODE


def event() -> _Event:
    if _EVENT is None:
        raise RuntimeError("no event: call pbs.stub_event(...) before running a hook")
    return _EVENT


def logmsg(level: int, msg: str) -> None:
    LOG.append((level, str(msg)))


SERVER_EVENTS = (QUEUEJOB, MODIFYJOB, RESVSUB, MOVEJOB, RUNJOB)


def stub_event(event_type: int, *, resources: dict | None = None, requestor: str = "alice",
               config_file: str | None = None, queues=("workq",), original: dict | None = None,
               env: dict | None = None, progname: str = "", argv: list | None = None,
               local_node: str = "localhost", original_variables: dict | None = None,
               defined: dict[str, str] | None = None, job_set: dict | None = None, **attrs) -> _Event:
    """Set up the event the next hook run sees. ``resources``: the job's Resource_List as submitted
    (text or values, typed here as the server types them); ``defined``: the server's custom
    resources (name -> long|string|size|time|boolean|float; default tether's own); ``original`` /
    ``original_variables``: the job before qalter (modifyjob); ``env``/``progname``/``argv``: the
    task execjob_launch is about to start (env as plain values, as PBS gives it; ``job_set``: what a
    job's own TM client put on top of it); ``attrs``: other job attributes."""
    global _EVENT, hook_config_filename, _QUEUES, _LOCAL_NODE, _DAEMON
    if event_type not in SERVER_EVENTS:
        _check_mom_event(event_type, resources or {}, attrs, env, argv)
    LOG.clear()
    define_resources(defined)
    _QUEUES = tuple(queues)
    _LOCAL_NODE = local_node
    _DAEMON = "server" if event_type in SERVER_EVENTS else "mom"
    hook_config_filename = config_file
    params: dict = {"job": job(event_type, _DAEMON, Resource_List=dict(resources or {}), **attrs)}
    if event_type == MODIFYJOB:
        attrs_o = {**attrs, **({"Variable_List": original_variables} if original_variables is not None else {})}
        params["job_o"] = job(0, _DAEMON, Resource_List=dict(original or {}), **attrs_o) \
            if original is not None else None
    if event_type not in SERVER_EVENTS:
        params["vnode_list"] = {}
    if event_type == EXECJOB_LAUNCH:
        params.update(env=pbs_env.from_plain({**(env or {}), **(job_set or {})}), progname=progname,
                      argv=list(argv or []))
    _EVENT = _Event(event_type, params, requestor)
    return _EVENT


_HEX_TASK = re.compile(r"[0-9A-F]{8}")


def _check_mom_event(event_type: int, resources: dict, attrs: dict, env: dict | None, argv: list | None) -> None:
    """Refuse a MoM event real OpenPBS never hands a hook (see the module doc; the case ids name
    the recording)."""
    if attrs.get("exec_host") is not None:
        raise ValueError("a MoM hook sees job.exec_host None (hook-execjob_begin-view): give exec_vnode, "
                         "exec_host2 and schedselect (tether.testing.pbs.MomJob)")
    for name in ("select", "nodect", "mpiprocs"):
        if resources.get(name) is not None:
            raise ValueError(f"a MoM hook sees Resource_List.{name} None (hook-execjob_begin-view)")
    if event_type != EXECJOB_LAUNCH or env is None:
        return
    if "PBS_VNODENUM" in env:
        raise ValueError("OpenPBS never sets PBS_VNODENUM (hook-execjob_launch-pbsdsh-task-1); a job's own "
                         "value goes in job_set")
    task = env.get("PBS_TASKNUM")
    if argv:                                   # a TM task (pbsdsh, pbs_tmrsh, MPI)
        if "PBS_NODEFILE" in env:
            raise ValueError("a TM task's environment has no PBS_NODEFILE (hook-execjob_launch-pbsdsh-task-1)")
        if task is not None and not _HEX_TASK.fullmatch(task):
            raise ValueError(f"a TM task's PBS_TASKNUM is 8 upper-case hex digits, not {task!r} "
                             f"(hook-execjob_launch-tmrsh-12-tasks)")
    elif task is not None and task != "1":
        raise ValueError(f"the job shell's PBS_TASKNUM is '1', not {task!r} (hook-execjob_launch-job-shell)")

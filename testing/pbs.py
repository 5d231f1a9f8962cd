"""PBS for tests: the ``pbs`` module stand-in, hook runs (also across interpreter restarts), and a
stateful fake OpenPBS (qsub, qstat, qdel, pbsnodes, pbs_tmrsh) that runs tether's submit hook.

- ``PBS_MODULE_DIR``: put it first on ``sys.path`` and ``import pbs`` gives the stand-in
  (testing/pbs_module/pbs.py: its doc says what it mirrors, citing OpenPBS's sources).
- ``run_hook(path, event)``: run a hook file as pbs_server does (as ``__main__``, ending with
  ``e.accept()``/``e.reject()``) in this interpreter, against an event from ``pbs.stub_event``.
- ``ServerInterpreter``: the hook interpreter of pbs_server -- kept across hook runs and restarted
  (Py_Finalize + Py_Initialize, site off, optimization level 2) as the server restarts it when
  resources are created or deleted. Built from testing/pbs_interpreter.c with gcc and libpython.
- ``FakePbs(root, config=...)``: qsub parses options and ``#PBS`` lines as qsub does (POSIX getopt;
  an unknown option: ``qsub: invalid option -- 'x'`` and the usage, exit 2), hands the request to
  tether's real submit hook (tether_submit.py with the JSON config ``tether pbs install`` writes
  for the site's ``tether.yaml``) through the stand-in, and keeps the job: ``qsub: <message>``
  and exit 32 when the hook rejects (as a real server answers). qstat ``-f -F json`` prints the
  job as OpenPBS 23.06 does; qdel; pbsnodes ``-a [-F json]``; pbs_tmrsh runs a command "on" a
  host of the job (this host), refusing outside a job as the real one does.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import pwd
import runpy
import secrets
import shlex
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from .fakebin import FakeCommands, JobTable, UsageError, getopt_long, install_fakes, record_call, run_main

PBS_MODULE_DIR = Path(__file__).resolve().parent / "pbs_module"
COMMANDS = ("qsub", "qstat", "qdel", "pbsnodes", "pbs_tmrsh", "qmgr")
REJECTED = 32                     # qsub's exit status when a hook rejects (seen on OpenPBS 23.06)
UNKNOWN_JOB = 153                 # PBSE_UNKJOBID (15001) as an exit status: 15001 % 256
QSUB_GETOPT = "a:A:c:C:e:fhIj:J:k:l:m:M:N:o:p:q:r:R:S:u:v:VW:XzP:"   # src/cmds/qsub_sup.c, GETOPT_ARGS
QSUB_USAGE = ("usage: qsub [-a date_time] [-A account_string] [-c interval] [-C directive_prefix] "
              "[-e path] [-f ] [-h ] [-I [-X]] [-j oe|eo] [-J X-Y[:Z]] [-k keep] [-l resource_list] "
              "[-m mail_options] [-M user_list] [-N jobname] [-o path] [-p priority] [-P project] "
              "[-q queue] [-r y|n] [-R o|e|oe] [-S path] [-u user_list] [-W otherattributes=value...] "
              "[-v variable_list] [-V ] [-z] [script | -- command [arg1 ...]]\n       qsub --version")


def pbs_module():
    """The stand-in ``pbs`` module (imported from PBS_MODULE_DIR)."""
    if str(PBS_MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(PBS_MODULE_DIR))
    import pbs

    if Path(pbs.__file__).resolve().parent != PBS_MODULE_DIR:
        raise RuntimeError(f"another module named pbs was imported first: {pbs.__file__}")
    return pbs


def run_hook(path: str | Path, event: Any) -> Any:
    """Run the hook file ``path`` as PBS does against ``event`` (from ``pbs.stub_event``); returns
    the event. A hook must end with accept() or reject(); anything it raises is raised here."""
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit:
        pass
    else:
        raise AssertionError(f"{path} ended without e.accept() or e.reject()")
    if event.accepted is None:
        raise AssertionError(f"{path} exited without e.accept() or e.reject()")
    return event


def submit_hook_config(config: Any) -> dict:
    """The submit hook's JSON config for a validated Config, exactly as ``tether pbs install`` writes it."""
    from ..admin.pbs import SUBMIT_HOOK, hook_configs

    return hook_configs(config, Path("/opt/tether/libexec"))[SUBMIT_HOOK]


def submit_hook_file() -> Path:
    from ..admin.pbs import hook_file

    return hook_file()


# ---- pbs_server's hook interpreter --------------------------------------------------------------------
class ServerInterpreter:
    """Runs a hook file in an embedded interpreter the way pbs_server runs it (see the module doc)."""

    SOURCE = Path(__file__).resolve().parent / "pbs_interpreter.c"
    DRIVER = Path(__file__).resolve().parent / "pbs_interpreter_driver.py"

    def __init__(self, build_dir: Path):
        self.build_dir = Path(build_dir)
        self.binary = self.build()

    def build(self) -> Path:
        """Compile the interpreter program against this Python's libpython (once per build_dir)."""
        from ..system.toolchain import CBuild

        include = sysconfig.get_paths()["include"]
        libdir = sysconfig.get_config_var("LIBDIR")
        version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var("VERSION")
        target = self.build_dir / "tether-pbs-interpreter"
        cbuild = CBuild(self.build_dir)
        obj = cbuild.compile(self.SOURCE, include_dirs=[include])
        if not target.exists():
            cbuild.link([obj], target, link_args=[f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{libdir}",
                                                   "-ldl", "-lm"])
        return target

    def run(self, hook: str | Path, hook_config: str | Path, rounds: list[list[dict]], *,
            timeout: float = 120) -> list[list[dict]]:
        """Run ``hook`` for each round's events (dicts of ``pbs.stub_event`` keywords plus ``type``:
        "queuejob", "modifyjob", ...), one interpreter per round, restarted in between. Returns
        each event's outcome: accepted, reject_msg, resources, attributes, log -- and
        ``exception`` when the hook raised (what PBS reports as "encountered an exception")."""
        with tempfile.TemporaryDirectory(prefix="tether-pbs-interp-") as tmp:
            spec = Path(tmp) / "spec.json"
            output = Path(tmp) / "out.jsonl"
            spec.write_text(json.dumps({"hook": str(hook), "hook_config": str(hook_config), "rounds": rounds,
                                        "pbs_module_dir": str(PBS_MODULE_DIR), "output": str(output)}))
            proc = subprocess.run([str(self.binary), str(len(rounds)), str(self.DRIVER), str(spec)],
                                  capture_output=True, text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"})
            if proc.returncode != 0:
                raise RuntimeError(f"the interpreter failed ({proc.returncode}): {proc.stderr[-2000:]}")
            return [json.loads(line) for line in output.read_text().splitlines()]


# ---- a running job, as each MoM's hooks see it ------------------------------------------------------
MOM_PORT = 15002                  # exec_host2's port, and PBS_MOMPORT (15003) that tasks see
PBS_HOME = "/var/spool/pbs"


def select_chunks(select: str) -> list[dict[str, str]]:
    """``2:ncpus=2:mpiprocs=2+1:ncpus=1`` -> one dict per chunk (the count expanded)."""
    chunks: list[dict[str, str]] = []
    for spec in select.split("+"):
        count, *items = spec.split(":")
        if not count.isdigit():
            count, items = "1", [count, *items]
        chunks += [dict(item.split("=", 1) for item in items)] * int(count)
    return chunks


def chunk_mpiprocs(chunk: dict[str, str]) -> int:
    """A chunk's lines in the node file: mpiprocs, else 1 -- 0 when it has no ncpus (start_exec.c
    job_nodes_inner)."""
    if "mpiprocs" in chunk:
        return int(chunk["mpiprocs"])
    return 1 if int(chunk.get("ncpus", "0")) else 0


class MomJob:
    """A running job as the MoM hooks of each of its hosts see it, for tests of tether's MoM hook.

    Single-host facts are recorded on OpenPBS 23.06.06 (tests/fixtures/pbs/openpbs-mom-cases.json,
    replayed by tests/unit/test_pbs_replay.py): ``exec_host`` None, the placement in ``exec_vnode``
    ``(h:ncpus=N)+...``, ``exec_host2`` ``h:15002/I[*N]`` and ``schedselect`` (one entry per chunk),
    ``Resource_List`` only ``ncpus`` and ``place`` (and flag=m custom resources); the job shell is
    task ``1`` (decimal) with ``PBS_NODEFILE``; a TM task has neither PBS_NODEFILE nor USER/LOGNAME/
    SHELL, ``PATH=/bin:/usr/bin`` and ``PBS_TASKNUM`` as 8 upper-case hex digits. A second host was
    not recorded; its task numbers follow OpenPBS's ``momtask_create`` (src/resmom/mom_comm.c): a
    counter per host from 1 (the first host's 1 is the job shell) with the host's index in the
    job (PBS_NODENUM) in the top ``numbits(mpiprocs of the job)`` bits of 32.
    ``hosts``: the host of each chunk of ``select``, in order."""

    def __init__(self, job_id: str, user: str, select: str, hosts: list[str], *, resources: dict | None = None,
                 variables: dict | None = None, place: str = "free", group: str | None = None,
                 home: str = "/home/user", workdir: str = "/tmp", name: str = "job.sh", shell: str = "/bin/sh"):
        self.id, self.user, self.group, self.home, self.shell = job_id, user, group or user, home, shell
        self.chunks = select_chunks(select)
        if len(hosts) != len(self.chunks):
            raise ValueError(f"{len(self.chunks)} chunks in {select!r}, {len(hosts)} hosts given")
        self.chunk_hosts = list(hosts)
        self.hosts = list(dict.fromkeys(hosts))
        self.schedselect = select
        seen: dict[str, int] = {}
        vnodes, hosts2 = [], []
        for host, chunk in zip(hosts, self.chunks):
            extra = "".join(f":{k}={chunk[k]}" for k in ("ngpus", "mem") if k in chunk)
            ncpus = int(chunk.get("ncpus", "1"))
            vnodes.append(f"({host}:ncpus={ncpus}{extra})")
            hosts2.append(f"{host}:{MOM_PORT}/{seen.get(host, 0)}" + (f"*{ncpus}" if ncpus != 1 else ""))
            seen[host] = seen.get(host, 0) + 1
        self.exec_vnode, self.exec_host2 = "+".join(vnodes), "+".join(hosts2)
        self.nodefile = [host for host, chunk in zip(hosts, self.chunks) for _ in range(chunk_mpiprocs(chunk))]
        self.resources = {"ncpus": sum(int(c.get("ncpus", "1")) for c in self.chunks), "place": place,
                          **(resources or {})}
        self.name, self.cookie = name, "0123456789ABCDEF0123456789ABCDEF"
        self.variables = {"PBS_O_HOME": home, "PBS_O_HOST": "localhost", "PBS_O_INTERACTIVE_AUTH_METHOD": "resvport",
                          "PBS_O_INTERACTIVE_ENCRYPT_METHOD": "", "PBS_O_LANG": "C.UTF-8", "PBS_O_LOGNAME": user,
                          "PBS_O_PATH": "/opt/pbs/bin:/usr/local/bin:/usr/bin:/bin", "PBS_O_QUEUE": "workq",
                          "PBS_O_SHELL": shell, "PBS_O_SYSTEM": "Linux", "PBS_O_WORKDIR": workdir,
                          **(variables or {})}
        self._next_task = {host: 2 if i == 0 else 1 for i, host in enumerate(self.hosts)}

    def attrs(self, event_type: int) -> dict[str, Any]:
        """``pbs.stub_event`` keywords for this job at ``event_type`` (job_state as a digit, as recorded)."""
        pbs = pbs_module()
        state = {pbs.EXECJOB_BEGIN: "0", pbs.EXECJOB_LAUNCH: "4"}.get(event_type, "5")
        return {"id": self.id, "euser": self.user, "egroup": self.group, "exec_vnode": self.exec_vnode,
                "exec_host2": self.exec_host2, "schedselect": self.schedselect, "job_state": state,
                "Job_Name": self.name, "Variable_List": dict(self.variables), "resources": dict(self.resources)}

    def _env(self, host: str) -> dict[str, str]:
        index = self.hosts.index(host)
        ncpus = next(c.get("ncpus", "1") for h, c in zip(self.chunk_hosts, self.chunks) if h == host)
        return {"ENVIRONMENT": "BATCH", "HOME": self.home, "NCPUS": ncpus, "OMP_NUM_THREADS": ncpus,
                "PATH": "/bin:/usr/bin", "PBS_ENVIRONMENT": "PBS_BATCH", "PBS_JOBCOOKIE": self.cookie,
                "PBS_JOBDIR": self.home, "PBS_JOBID": self.id, "PBS_JOBNAME": self.name,
                "PBS_MOMPORT": str(MOM_PORT + 1), "PBS_NODENUM": str(index), **self.variables,
                "PBS_QUEUE": "workq", "TMPDIR": f"/var/tmp/pbs.{self.id}"}

    def shell_env(self) -> dict[str, str]:
        """The job shell's environment at execjob_launch (on the first host)."""
        return {**self._env(self.hosts[0]), "LOGNAME": self.user, "USER": self.user, "SHELL": self.shell,
                "PBS_NODEFILE": f"{PBS_HOME}/aux/{self.id}", "PBS_TASKNUM": "1"}

    def task_number(self, host: str) -> int:
        """The number the MoM of ``host`` gives its next TM task (and counts it)."""
        index = self.hosts.index(host)
        counter = self._next_task[host]
        self._next_task[host] += 1
        bits = len(self.nodefile).bit_length()
        return counter | (index << (32 - bits)) if index else counter

    def task_env(self, host: str) -> dict[str, str]:
        """The environment of the next TM task (pbsdsh, pbs_tmrsh, MPI) on ``host`` at execjob_launch."""
        return {**self._env(host), "PBS_TASKNUM": f"{self.task_number(host):08X}"}

    def pbsdsh(self) -> list[tuple[str, dict[str, str]]]:
        """``pbsdsh -- CMD``: one task per node file line, spawned in its order: (host, environment)."""
        return [(host, self.task_env(host)) for host in self.nodefile]


# ---- the fake server ------------------------------------------------------------------------------
class State(JobTable):
    """The fake server's state directory: ``server.json`` (set up by FakePbs) and the jobs."""

    EMPTY = {"next": 0, "jobs": {}}

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.server = json.loads((self.path / "server.json").read_text())


def split_list(text: str) -> list[str]:
    """qsub's comma-separated lists (``-l``, ``-v``): commas inside quotes do not split."""
    items, cur, quote = [], [], None
    for c in text:
        if quote:
            if c == quote:
                quote = None
            else:
                cur.append(c)
        elif c in "'\"":
            quote = c
        elif c == ",":
            items.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    items.append("".join(cur))
    return [i for i in items if i]


def directive_args(script: str, prefix: str = "#PBS") -> list[str]:
    """The options of the ``#PBS`` lines before the first command (qsub's rule)."""
    args: list[str] = []
    for line in script.splitlines()[1:] if script.startswith("#!") else script.splitlines():
        stripped = line.strip()
        if stripped.startswith(prefix):
            args += shlex.split(stripped[len(prefix):], comments=False)
            continue
        if stripped and not stripped.startswith("#"):
            break
    return args


def _qsub_options(argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    short = {c: (1 if QSUB_GETOPT[i + 1:i + 2] == ":" else 0) for i, c in enumerate(QSUB_GETOPT) if c != ":"}
    try:
        return getopt_long("qsub", argv, {"version": 0}, short)
    except UsageError as exc:
        raise UsageError(f"{exc}\n{QSUB_USAGE}", status=2) from None


def _qsub_script(argv: list[str], rest: list[str]) -> tuple[str, str]:
    """(the job script, what qsub records as its command): a file, ``-- command``, or stdin."""
    if rest and argv[argv.index(rest[0]) - 1:argv.index(rest[0])] == ["--"]:
        return "#!/bin/sh\n" + shlex.join(rest) + "\n", "(command)"
    if rest:
        try:
            return Path(rest[0]).read_text(), os.path.abspath(rest[0])
        except OSError:
            raise UsageError("qsub: script file:: No such file or directory", status=2) from None
    return sys.stdin.read(), "STDIN"


def _qsub_request(options: list[tuple[str, str | None]]) -> tuple[dict, dict, dict]:
    """(resources, variables, job attributes) from qsub's options, the later ones winning."""
    resources: dict[str, str] = {}
    variables: dict[str, str] = {}
    attrs: dict[str, Any] = {}
    named = {"q": "queue", "N": "Job_Name", "A": "Account_Name", "P": "project"}
    for name, value in options:
        if name == "l":
            for item in split_list(value):
                key, eq, val = item.partition("=")
                if not eq:
                    raise UsageError(f"qsub: illegal -l value\n{QSUB_USAGE}", status=2)
                resources[key] = val
        elif name == "v":
            for item in split_list(value):
                key, eq, val = item.partition("=")
                variables[key] = val if eq else os.environ.get(key, "")
        elif name == "V":
            variables.update(os.environ)
        elif name in named:
            attrs[named[name]] = value
        else:
            attrs.setdefault("other", {})[name] = value
    return resources, variables, attrs


def qsub(argv: list[str], state: State) -> int:
    opts, rest = _qsub_options(argv)
    if ("version", None) in opts:
        print("pbs_version = 23.06.06")
        return 0
    script, command = _qsub_script(argv, rest)
    prefix = next((v for n, v in opts if n == "C"), "#PBS")
    directives, _ = _qsub_options(directive_args(script, prefix))
    resources, variables, attrs = _qsub_request(directives + opts)      # the command line wins
    server = state.server
    queue = attrs.get("queue")
    if queue and queue not in server["queues"]:
        sys.stderr.write(f"qsub: Unknown queue\n")
        return 2
    user = getpass.getuser()
    # what qsub adds of its own (recorded: job-shell-process-env; PBS_O_QUEUE once the queue is known)
    variables = {"PBS_O_HOME": os.environ.get("HOME", ""), "PBS_O_LOGNAME": user,
                 **({"PBS_O_LANG": os.environ["LANG"]} if "LANG" in os.environ else {}),
                 "PBS_O_PATH": os.environ.get("PATH", ""), "PBS_O_SHELL": os.environ.get("SHELL", "/bin/sh"),
                 "PBS_O_INTERACTIVE_AUTH_METHOD": "resvport", "PBS_O_INTERACTIVE_ENCRYPT_METHOD": "",
                 "PBS_O_WORKDIR": os.getcwd(), "PBS_O_SYSTEM": os.uname().sysname,
                 "PBS_O_HOST": socket.gethostname(), **variables}
    try:
        outcome = run_submit_hook(state, resources, variables, attrs, user)
    except Exception as exc:                      # refused before any hook runs, as the server does
        pbs = pbs_module()
        if isinstance(exc, pbs.UnsetResourceNameError):
            name = str(exc).rsplit(" ", 1)[-1]
            sys.stderr.write(f"qsub: Unknown resource Resource_List.{name}\n")
        elif isinstance(exc, pbs.BadAttributeValueError):
            sys.stderr.write(f"qsub: Illegal attribute or resource value Resource_List\n")
        else:
            raise
        return 2                                  # (qsub's exit status here is not verified)
    record_call(state.path, {"tool": "qsub-hook", "outcome": outcome})
    if outcome.get("exception"):
        sys.stderr.write("qsub: request rejected as filter hook 'tether_submit' encountered an exception. "
                         "Please inform Admin\n")
        return REJECTED
    if not outcome["accepted"]:
        sys.stderr.write(f"qsub: {outcome['reject_msg']}\n")
        return REJECTED
    with state.jobs() as data:
        seq = data["next"]
        data["next"] += 1
        job_id = f"{seq}.{server['name']}"
        name = attrs.get("Job_Name") or (os.path.basename(command) if command.startswith("/") else command)
        job_queue = outcome["attributes"].get("queue") or queue or server["default_queue"]
        variables = {**variables, "PBS_O_QUEUE": job_queue}
        data["jobs"][job_id] = {
            "id": job_id, "Job_Name": name, "Job_Owner": f"{user}@{socket.gethostname()}", "job_state": "Q",
            "queue": job_queue,
            "Resource_List": outcome["resources"], "Variable_List": variables,
            "comment": outcome["attributes"].get("comment"), "Rerunable": outcome["attributes"].get("Rerunable"),
            "umask": outcome["attributes"].get("umask"), "project": outcome["attributes"].get("project"),
            "script": script, "command": command, "qtime": time.strftime("%a %b %d %H:%M:%S %Y"),
            "Exit_status": None, "workdir": os.getcwd(), "log": outcome["log"]}
    print(job_id)
    return 0


def run_submit_hook(state: State, resources: dict, variables: dict, attrs: dict, user: str,
                    event_type: str = "QUEUEJOB") -> dict:
    """tether's submit hook for a request, through the stand-in; its outcome."""
    pbs = pbs_module()
    job_attrs = {k: v for k, v in attrs.items() if k in ("Job_Name", "Account_Name", "project")}
    event = pbs.stub_event(getattr(pbs, event_type), resources=resources, requestor=user,
                           config_file=str(state.path / "tether_submit.json"), queues=tuple(state.server["queues"]),
                           defined=state.server["custom_resources"], Variable_List=variables, **job_attrs)
    outcome: dict[str, Any] = {}
    try:
        run_hook(submit_hook_file(), event)
    except Exception as exc:                   # what the server reports as "encountered an exception"
        outcome["exception"] = f"{type(exc).__name__}: {exc}"
    job = event.job
    outcome.update(accepted=event.accepted, reject_msg=event.reject_msg, log=[m for _, m in pbs.LOG],
                   resources={k: str(job.Resource_List[k]) for k in job.Resource_List.keys()},
                   attributes={k: (None if getattr(job, k) is None else str(getattr(job, k)))
                               for k in ("queue", "Rerunable", "umask", "project", "comment")})
    return outcome


def _job_json(job: dict) -> dict:
    """A job as ``qstat -f -F json`` shows it (OpenPBS 23.06 names; values as text)."""
    out = {"Job_Name": job["Job_Name"], "Job_Owner": job["Job_Owner"], "job_state": job["job_state"],
           "queue": job["queue"], "qtime": job["qtime"], "Rerunable": "True" if job.get("Rerunable") in ("1", "True") else "False",
           "Resource_List": dict(job["Resource_List"]), "Variable_List": dict(job["Variable_List"])}
    for key in ("comment", "project", "umask", "Exit_status", "exec_host", "exec_vnode"):
        if job.get(key) is not None:
            out[key] = job[key]
    return out


def qstat(argv: list[str], state: State) -> int:
    short = {c: 0 for c in "aeinpqrstwxfGHJMQEBT1"}
    short.update({"u": 1, "W": 1, "F": 1, "D": 1})
    try:
        opts, ids = getopt_long("qstat", argv, {"version": 0}, short)
    except UsageError as exc:
        raise UsageError(f"{exc}\nusage:\n\tqstat [-f] [-J] [-p] [-t] [-x] [-E] [-F format] [-D delim] "
                         f"[ job_identifier... | destination... ]", status=2) from None
    given = dict(opts)
    with state.jobs() as data:
        jobs = data["jobs"]
    server = state.server["name"]
    selected = {}
    for job_id in ids:
        full = job_id if "." in job_id else f"{job_id}.{server}"
        if full not in jobs or (jobs[full]["job_state"] == "F" and "x" not in given):
            sys.stderr.write(f"qstat: Unknown Job Id {full}\n" if full not in jobs else
                             f"qstat: {full} Job has finished, use -x or -H to obtain historical job information\n")
            return UNKNOWN_JOB
        selected[full] = jobs[full]
    if not ids:
        selected = {k: v for k, v in jobs.items() if v["job_state"] != "F" or "x" in given}
    if "f" in given and given.get("F") == "json":
        print(json.dumps({"timestamp": int(time.time()), "pbs_version": "23.06.06", "pbs_server": server,
                          "Jobs": {k: _job_json(v) for k, v in selected.items()}}, indent=4))
        return 0
    if "F" in given:
        raise UsageError(f"qstat: -F {given['F']} is not supported by this fake (json is)", status=2)
    if "f" in given:
        for job_id, job in selected.items():
            print(f"Job Id: {job_id}")
            for key, value in _job_json(job).items():
                if key == "Resource_List":
                    for k, v in value.items():
                        print(f"    Resource_List.{k} = {v}")
                elif key == "Variable_List":
                    print("    Variable_List = " + ",".join(f"{k}={v}" for k, v in value.items()))
                else:
                    print(f"    {key} = {value}")
            print()
        return 0
    if selected:
        print("Job id            Name             User              Time Use S Queue")
        print("----------------  ---------------- ----------------  -------- - -----")
        for job_id, job in selected.items():
            print(f"{job_id:<17} {job['Job_Name'][:16]:<16} {job['Job_Owner'].split('@')[0][:16]:<16}  "
                  f"{'0':>8} {job['job_state']} {job['queue']}")
    return 0


def qdel(argv: list[str], state: State) -> int:
    try:
        opts, ids = getopt_long("qdel", argv, {"version": 0}, {"W": 1, "x": 0})
    except UsageError as exc:
        raise UsageError(f"{exc}\nusage: qdel [-W force|suppress_email=X] [-x] job_identifier...\n"
                         f"       qdel --version", status=2) from None
    if not ids:
        raise UsageError("usage: qdel [-W force|suppress_email=X] [-x] job_identifier...", status=2)
    status = 0
    with state.jobs() as data:
        for job_id in ids:
            full = job_id if "." in job_id else f"{job_id}.{state.server['name']}"
            job = data["jobs"].get(full)
            if job is None or job["job_state"] == "F":
                sys.stderr.write(f"qdel: Unknown Job Id {full}\n" if job is None else
                                 f"qdel: Job has finished {full}\n")
                status = UNKNOWN_JOB if job is None else 35
                continue
            if job.get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job["pid"], 15)
            job["job_state"], job["Exit_status"] = "F", -3 if job["job_state"] == "Q" else 271
    return status


def pbsnodes(argv: list[str], state: State) -> int:
    try:
        opts, names = getopt_long("pbsnodes", argv, {"version": 0},
                                  {**{c: 0 for c in "acdHjlLoqrSv"}, "C": 1, "D": 1, "F": 1, "s": 1})
    except UsageError as exc:
        raise UsageError(f"{exc}\nusage:\tpbsnodes [-o|-r] [-C comment] [-s server] host host ...\n"
                         f"\tpbsnodes -a [-F json|dsv] [-s server]", status=1) from None
    given = dict(opts)
    nodes = state.server["nodes"]
    if "o" in given or "r" in given:
        if os.getuid() != 0:
            sys.stderr.write(f"pbsnodes: Unauthorized Request  {' '.join(names)}\n")
            return 1
        for name in names:
            nodes[name]["state"] = "offline" if "o" in given else "free"
        (state.path / "server.json").write_text(json.dumps(state.server))
        return 0
    shown = {n: v for n, v in nodes.items() if not names or n in names}
    if given.get("F") == "json":
        print(json.dumps({"timestamp": int(time.time()), "pbs_version": "23.06.06",
                          "pbs_server": state.server["name"], "nodes": shown}, indent=4))
        return 0
    for name, node in shown.items():
        print(name)
        for key, value in node.items():
            if isinstance(value, dict):
                for k, v in value.items():
                    print(f"     {key}.{k} = {v}")
            else:
                print(f"     {key} = {value}")
        print()
    return 0


def pbs_tmrsh(argv: list[str], state: State) -> int:
    """A task "on" a host of the job: here. As OpenPBS's (src/cmds/pbs_tmrsh.c), with every answer
    recorded (tests/fixtures/pbs/openpbs-tm-cases.json): outside a job, a host not in
    ``$PBS_NODEFILE`` (which it needs: a TM task has none), bad options -- exit 255. The command is
    a TM task the MoM starts in the user's home with the job's environment, exactly as recorded
    (``task-process-env-pbsdsh``): PBS's variables and the job's, ``PATH=/bin:/usr/bin``, no
    PBS_NODEFILE/USER/LOGNAME/SHELL, ``PBS_TASKNUM`` in 8 upper-case hex digits as that host's MoM
    numbers it, never the caller's exports. The server's execjob_launch hooks (``FakePbs(launch_hooks=)``)
    run first, through the stand-in ``pbs`` module; one that rejects the task means it never starts
    and pbs_tmrsh prints **nothing and exits 0** (``tmrsh-task-rejected-by-launch-hook``; the MoM log
    says why: ``mom.log`` in the state directory). A command that cannot start: its message, exit 254.
    pbs_tmrsh passes no signal on: when it is killed, the task runs on. Otherwise its status is the
    task's."""
    usage = "usage: pbs_tmrsh [-n][-l username] host [-n][-l username] command\n       pbs_tmrsh --version\n"
    if argv == ["--version"]:
        print("pbs_version = 23.06.06")
        return 0
    host, err, at = None, False, 0
    while at < len(argv):                      # pbs_tmrsh.c's own loop: options before and after the host
        arg = argv[at]
        if arg.startswith("-"):
            if arg == "-n":                    # a no-op (rsh's)
                at += 1
                continue
            if not arg.startswith("-l"):
                err = True
                break
            name = arg[2:] or (argv[at + 1] if at + 1 < len(argv) else None)
            at += 1 if arg[2:] else 2
            if name is None:
                err = True
                break
            if name != getpass.getuser():
                sys.stderr.write(f'pbs_tmrsh: bad user "{name}"\n')
                err = True
            continue
        if host is not None:
            break                              # the host is set: the command starts here
        host, at = arg, at + 1
    if err or at >= len(argv) or host is None:
        sys.stderr.write(usage)
        return 255
    command = argv[at:]
    if "PBS_ENVIRONMENT" not in os.environ:
        sys.stderr.write("pbs_tmrsh: not executing under PBS\n")
        return 255
    if "PBS_JOBID" not in os.environ:
        sys.stderr.write("pbs_tmrsh: PBS jobid not in environment\n")
        return 255
    job_id = os.environ["PBS_JOBID"]
    with state.jobs() as data:                 # tm_init: the MoM must run this job
        running = data["jobs"].get(job_id, {}).get("job_state") == "R"
    if not running:
        sys.stderr.write("pbs_tmrsh: tm_init: TM_ESYSTEM\n")
        return 255
    if "PBS_NODEFILE" not in os.environ:
        sys.stderr.write("pbs_tmrsh: cannot find PBS_NODEFILE\n")
        return 255
    with open(os.environ["PBS_NODEFILE"]) as fh:
        hosts = list(dict.fromkeys(line.strip().split(".")[0] for line in fh if line.strip()))
    if host.split(".")[0] not in hosts:
        sys.stderr.write(f"pbs_tmrsh: host \"{host}\" is not a node in job <{job_id}>\n")
        return 255
    with state.jobs() as data:                 # each host's MoM numbers its tasks (MomJob.task_number)
        job = data["jobs"][job_id]
        job_hosts = list(dict.fromkeys(job["chunk_hosts"]))
        index = job_hosts.index(host.split(".")[0])
        bits = job["mpiprocs"].bit_length()           # from the job, never from a file the job can change
        counters = job["tasks"] if isinstance(job.get("tasks"), dict) else {}
        counter = counters.get(str(index), 2 if index == 0 else 1)
        job["tasks"] = {**counters, str(index): counter + 1}
        ncpus = job["host_ncpus"].get(job_hosts[index], "1")
        env = {**job["task_environment"], "NCPUS": ncpus, "OMP_NUM_THREADS": ncpus, "PBS_NODENUM": str(index),
               "PBS_TASKNUM": f"{counter | (index << (32 - bits)) if index else counter:08X}"}
    env, command, rejected = _launch_hooks(state, job, job_hosts[index], env, command)
    if rejected is not None:
        with open(state.path / "mom.log", "a") as log:   # what the MoM logs; pbs_tmrsh says nothing
            log.write(f"pbs_mom;Job;{job_id};{rejected}\npbs_mom;Job;{job_id};task not started, Failure "
                      f"{command[0]} -17\n")
        return 0
    try:
        proc = subprocess.Popen(command, env=env, cwd=env["HOME"], start_new_session=True)
    except OSError as exc:                     # the task started and could not exec (tmrsh-missing-command)
        sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
        return 254
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


def _launch_hooks(state: State, job: dict, host: str, env: dict[str, str], command: list[str]
                  ) -> tuple[dict[str, str], list[str], str | None]:
    """The server's execjob_launch hooks for a TM task on ``host``, run through the stand-in with the
    job as that MoM's hooks see it (MomJob): the task's environment and argv as the hooks leave them,
    and the message of the hook that rejected it (else None)."""
    paths = state.server.get("launch_hooks") or []
    if not paths:
        return env, command, None
    pbs = pbs_module()
    select = job["Resource_List"].get("select") or "1:ncpus=1"
    mom_job = MomJob(job["id"], getpass.getuser(), select, job["chunk_hosts"], home=env["HOME"],
                     variables={k: v for k, v in job["Variable_List"].items()}, name=job["Job_Name"])
    for path in paths:
        event = pbs.stub_event(pbs.EXECJOB_LAUNCH, local_node=host, env=env, progname=command[0], argv=command,
                               **mom_job.attrs(pbs.EXECJOB_LAUNCH))
        run_hook(path, event)
        if not event.accepted:
            return env, command, event.reject_msg or ""
        env, command = event.env.task_env(), [str(a) for a in event.argv]
    return env, command, None


# ---- qmgr: resources, hooks and nodes, as recorded on OpenPBS 23.06.06 ----------------------------
# Each answer is a recorded one (tests/fixtures/pbs/openpbs-qmgr-cases.json, replayed by
# tests/unit/test_pbs_replay.py): the message with the object's name put in and the exit status.
QMGR_SERVER_ERROR = "qmgr: hook error returned from server\n"
QMGR_HOOK_EXISTS = "qmgr obj={name} svr=default: hook name '{name}' already registered, try another name\n"
QMGR_NO_HOOK = "qmgr obj={name} svr=default: {name} does not exist!\n"
QMGR_HOOK_PREFIX = "qmgr obj={name} svr=default: hook_name '{name}', cannot use PBS as a prefix it is reserved for pbs hooks\n"
QMGR_HOOK_NOT_FOUND = "qmgr obj={name} svr=default: hook not found\n"
QMGR_DUPLICATE = "qmgr obj={name} svr=default: Duplicate entry in list \nqmgr: Error (15055) returned from server\n"
# qmgr-delete-resource-missing; `set node N resources_available.X` of an undefined X names the
# attribute (not in the recording: seen by hand on an OpenPBS built from its sources, exit 187)
QMGR_UNKNOWN_RESOURCE = "qmgr obj={name} svr=default: Unknown resource{attribute}\nqmgr: Error (15035) returned from server\n"
QMGR_OVERWRITTEN = "hook '{name}' contents overwritten\n"
QMGR_STDIN_BANNER = "Max open servers: 49\n"
# resources a stock server defines besides the pbs module's builtins (seen in pbsnodes -av)
QMGR_NODE_RESOURCES = ("accelerator_memory", "naccelerators")


class QmgrError(Exception):
    """One qmgr command refused: the text qmgr prints on stderr and its exit status."""

    def __init__(self, stderr: str, status: int):
        super().__init__(stderr)
        self.stderr, self.status = stderr, status


def _qmgr_words(command: str) -> list[str]:
    """A qmgr command's words; ``a = b`` and ``a=b`` alike (attribute lists stay one word)."""
    return shlex.split(command.replace(" = ", "=").replace("= ", "=").replace(" =", "="))


def _qmgr_one(command: str, server: dict) -> str:
    """Run one qmgr command against ``server`` (changed in place); what it prints on stderr when
    it succeeds. Raises QmgrError as the recorded qmgr answers, and a plain error for a command
    this fake has no recording of (never a silent success)."""
    words = _qmgr_words(command)
    if len(words) < 3:
        raise ValueError(f"fake qmgr: no recorded answer for {command!r}")
    verb, kind, name, rest = words[0], words[1], words[2], words[3:]
    hooks, resources = server.setdefault("hooks", {}), server["custom_resources"]
    pbs = pbs_module()
    if kind == "hook":
        if verb == "create":
            if name.startswith("PBS"):
                raise QmgrError(QMGR_HOOK_PREFIX.format(name=name) + QMGR_SERVER_ERROR, 32)
            if name in hooks:
                raise QmgrError(QMGR_HOOK_EXISTS.format(name=name) + QMGR_SERVER_ERROR, 32)
            hooks[name] = {"attributes": {}, "contents": {}}
            return ""
        if name not in hooks:
            if verb == "list":
                raise QmgrError(QMGR_HOOK_NOT_FOUND.format(name=name) + QMGR_SERVER_ERROR, 1)
            if verb in ("set", "import", "delete"):
                raise QmgrError(QMGR_NO_HOOK.format(name=name) + QMGR_SERVER_ERROR, 32)
        elif verb == "delete":
            del hooks[name]
            return ""
        elif verb == "set":
            for item in rest:
                key, _, value = item.partition("=")
                hooks[name]["attributes"][key] = value
            return ""
        elif verb == "import" and len(rest) == 3:
            content_type, _, path = rest
            try:
                text = Path(path).read_text()
            except OSError:
                raise QmgrError(f"{path} - No such file or directory\n", 1) from None
            had = bool(hooks[name]["contents"])
            hooks[name]["contents"][content_type] = {"path": path, "text": text}
            # a first import is silent (seen by hand), an import over contents says so (recorded)
            return QMGR_OVERWRITTEN.format(name=name) if had else ""
    elif kind == "resource":
        if verb == "create":
            if name in resources or name in pbs.BUILTIN_RESOURCES:
                raise QmgrError(QMGR_DUPLICATE.format(name=name), 207)
            settings = dict(item.partition("=")[::2] for item in ",".join(rest).split(",") if item)
            resources[name] = settings.get("type", "long")
            server.setdefault("resource_flags", {})[name] = settings.get("flag", "")
            return ""
        if verb == "delete":
            if name not in resources:
                raise QmgrError(QMGR_UNKNOWN_RESOURCE.format(name=name, attribute=""), 187)
            del resources[name]
            return ""
    elif kind == "node" and verb == "set" and name in server["nodes"]:
        for item in rest:
            key, _, value = item.partition("=")
            group, _, resource_name = key.partition(".")
            if group != "resources_available" or not resource_name:
                raise ValueError(f"fake qmgr: no recorded answer for {command!r}")
            if resource_name not in resources and resource_name not in pbs.BUILTIN_RESOURCES \
                    and resource_name not in QMGR_NODE_RESOURCES:
                raise QmgrError(QMGR_UNKNOWN_RESOURCE.format(name=name, attribute=f" {key}"), 187)
            value = int(value) if value.isdigit() else value
            server["nodes"][name].setdefault("resources_available", {})[resource_name] = value
        return ""
    raise ValueError(f"fake qmgr: no recorded answer for {command!r}")


def qmgr(argv: list[str], state: State) -> int:
    """``qmgr -c COMMAND`` or commands on stdin (then ``Max open servers: 49`` first on stdout;
    each command runs, the status is the last refused one's). The commands tether's install and
    the README use: create/set/import/delete/list hook, create/delete resource, set node
    resources_available. Run as the server's manager (the caller is taken for root)."""
    if argv[:1] == ["--version"]:
        print("pbs_version = 23.06.06")
        return 0
    if len(argv) == 2 and argv[0] == "-c":
        commands = [argv[1]]
    elif not argv:
        sys.stdout.write(QMGR_STDIN_BANNER)
        commands = [line for line in sys.stdin.read().splitlines() if line.strip()]
    else:
        raise UsageError(f"fake qmgr: no recorded answer for the arguments {argv!r}", status=1)
    server = json.loads((state.path / "server.json").read_text())
    status = 0
    for command in commands:
        try:
            sys.stderr.write(_qmgr_one(command, server))
        except QmgrError as exc:
            sys.stderr.write(exc.stderr)
            status = exc.status
        (state.path / "server.json").write_text(json.dumps(server))
    return status


_DISPATCH = {"qsub": qsub, "qstat": qstat, "qdel": qdel, "pbsnodes": pbsnodes, "pbs_tmrsh": pbs_tmrsh,
             "qmgr": qmgr}


def main(name: str, argv: list[str], state_dir: str) -> int:
    state = State(state_dir)
    record_call(state_dir, {"tool": name, "argv": [name, *argv], "cwd": os.getcwd()})
    return run_main(name, lambda: _DISPATCH[name](argv, state))


class FakePbs(FakeCommands):
    """The fake server: commands in ``bin_dir``, state in ``state_dir``; see the module doc."""

    def __init__(self, root: Path, *, config: str | Path | None = None, nodes: int = 3, name: str = "pbs",
                 queues: list[str] | None = None, custom_resources: dict[str, str] | None = None,
                 launch_hooks: list[str | Path] = ()):
        """``custom_resources``: the server's custom resources (name -> long|string|size|...), by
        default tether's own as ``tether pbs install`` creates them -- no ``ngpus`` unless given,
        as on a stock server. ``launch_hooks``: hook files the MoMs run at execjob_launch for each
        TM task (pbs_tmrsh), in order."""
        from ..hooks.configfile import load_config

        self.root = Path(root)
        self.bin_dir, self.state_dir = self.root / "bin", self.root / "state"
        install_fakes(self.bin_dir, "pbs", COMMANDS, self.state_dir)
        site = load_config(str(config) if config else None, env={})
        if queues is None:
            pools = [site.data.get("default_compute_resource_pool"), site.data.get("default_aux_resource_pool")]
            queues = ["workq", *dict.fromkeys(p for p in pools if p and p != "workq")]
        (self.state_dir / "tether_submit.json").write_text(json.dumps(submit_hook_config(site)))
        node_table = {f"n{i}": {"Mom": f"n{i}", "state": "free", "resources_available": {"ncpus": 2, "host": f"n{i}"}}
                      for i in range(1, nodes + 1)}
        pbs = pbs_module()
        server = {"name": name, "queues": queues, "default_queue": queues[0], "nodes": node_table,
                  "custom_resources": dict(pbs.TETHER_RESOURCES if custom_resources is None else custom_resources),
                  "launch_hooks": [str(path) for path in launch_hooks]}
        (self.state_dir / "server.json").write_text(json.dumps(server))
        self.state = State(self.state_dir)

    def qsub(self, *argv: str, **kwargs) -> str:
        """Submit with the fake qsub; the job id. Raises SubmissionRefused when the hook rejects."""
        result = self.run("qsub", *argv, **kwargs)
        if result.returncode != 0:
            from .slurm import SubmissionRefused

            raise SubmissionRefused(result.returncode, result.stderr)
        return result.stdout.strip()

    def job(self, job_id: str) -> dict:
        """A job's record: Resource_List (select, place, ... as the hook left them), queue, comment..."""
        with self.state.jobs() as data:
            return data["jobs"][job_id]

    def run_job(self, job_id: str) -> dict[str, str]:
        """What the scheduler and the MoM do to start a queued job: its ``select`` chunks placed on
        the nodes (one chunk per node in order, ``place=scatter``; more chunks than nodes wrap
        around), ``job_state`` R with ``exec_host``/``exec_vnode`` as OpenPBS spells them, the
        nodefile (one line per mpiproc). Returns the job's environment (what its script and every
        TM task start with); pbs_tmrsh keeps to it."""
        with self.state.jobs() as data:
            job = data["jobs"][job_id]
            if job["job_state"] != "Q":
                raise ValueError(f"{job_id} is not queued ({job['job_state']})")
            select = job["Resource_List"].get("select") or "1:ncpus=1"
            chunks: list[dict[str, str]] = []
            for spec in select.split("+"):
                count, *items = spec.split(":")
                if not count.isdigit():
                    count, items = "1", [count, *items]
                chunks += [dict(item.split("=", 1) for item in items if "=" in item)] * int(count)
            nodes = list(self.state.server["nodes"])
            hosts, vnodes, lines = [], [], []
            for k, chunk in enumerate(chunks):
                node = nodes[k % len(nodes)]
                ncpus = chunk.get("ncpus", "1")
                hosts.append(f"{node}/0*{ncpus}")
                vnodes.append("(" + ":".join([node, f"ncpus={ncpus}"] + [f"{r}={chunk[r]}" for r in ("ngpus", "mem")
                                                                         if r in chunk]) + ")")
                lines += [node] * int(chunk.get("mpiprocs", "1"))
            nodefile = self.state_dir / f"aux-{job_id}"
            nodefile.write_text("".join(f"{line}\n" for line in lines))
            tmpdir = self.root / "var" / "tmp" / f"pbs.{job_id}"          # the MoM's $tmpdir (/var/tmp)
            tmpdir.mkdir(parents=True, exist_ok=True)
            home, user = os.environ.get("HOME", "/"), getpass.getuser()
            ncpus = {}                                   # NCPUS on each host: its first chunk's ncpus
            for k, chunk in enumerate(chunks):
                ncpus.setdefault(nodes[k % len(nodes)], chunk.get("ncpus", "1"))
            # what every process the MoM starts for the job has (recorded: job-shell-process-env,
            # task-process-env-pbsdsh): PBS's variables and the job's own (-v and PBS_O_*)
            base = {"ENVIRONMENT": "BATCH", "HOME": home, "PBS_ENVIRONMENT": "PBS_BATCH",
                    "PBS_JOBCOOKIE": secrets.token_hex(16).upper(), "PBS_JOBDIR": home, "PBS_JOBID": job_id,
                    "PBS_JOBNAME": job["Job_Name"], "PBS_MOMPORT": str(MOM_PORT + 1), **job["Variable_List"],
                    "PBS_QUEUE": job["queue"], "TMPDIR": str(tmpdir)}
            first = nodes[0]
            # the job shell: a login shell (its profile's PATH, /opt/pbs/bin last: here the fakes)
            env = {**base, "LOGNAME": user, "USER": user, "SHELL": pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh",
                   "PATH": f"/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games:{self.bin_dir}",
                   "PBS_NODEFILE": str(nodefile), "PBS_NODENUM": "0", "PBS_TASKNUM": "1",
                   "NCPUS": ncpus.get(first, "1"), "OMP_NUM_THREADS": ncpus.get(first, "1")}
            # a TM task: no PBS_NODEFILE, USER, LOGNAME, SHELL; PATH=/bin:/usr/bin; the caller's
            # exports never reach it
            job.update(job_state="R", exec_host="+".join(hosts), exec_vnode="+".join(vnodes), environment=env,
                       task_environment={**base, "PATH": "/bin:/usr/bin"}, host_ncpus=ncpus,
                       chunk_hosts=[nodes[k % len(nodes)] for k in range(len(chunks))], mpiprocs=len(lines),
                       tasks=1)
        return env


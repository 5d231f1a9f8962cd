"""The job_submit plugin's Python side: job request -> Request -> Plan -> answer.

Runs inside slurmctld on the C shim's worker thread (worker.c), for jobs that carry tether options.
The shim (plugin.c) copies what matters out of job_desc into a ``tether_job_t`` (bridge.h); this
handler reads the tether request from its ``spank_env`` (values forwarded by the SPANK plugin),
refuses options that conflict with the plan (naming them), runs the core planner and fills in the
struct's ``out_*`` fields, which plugin.c writes into job_desc with Slurm's allocator. No blocking
work: the config is re-read only when its file changed (a stat per tether job), keeping the last
good one when the new one is bad.
"""

from __future__ import annotations

import os
import pwd

from ..container.spec import LaunchError, check_container_options
from ..hooks.config import ON_FAILURE, Config
from ..hooks.configfile import config_path, load_config
from ..hooks.errors import ConfigError, RequestError
from ..hooks.plan import NODES, ONE, ROWS, SLOTS, SPN, Plan, make_plan
from ..hooks.policy import (
    SLURM_FIELD_OPTIONS, Arg, check_slurm_args, gres_references_gpu, strip_gres_prefix,
)
from ..hooks.request import Request
from ..hooks.surface import BY_NAME, OPTIONS, SLOT_OPTIONS, expected, normalize
from .partitions import partition_table, slurm_conf_path

ACCEPT, REJECT, ON_WORKER, FAILED = 1, 2, 3, -1   # bridge.h's TETHER_*
# The interpreter's recursion limit in slurmctld (set by the plugin's init code): the handler runs on
# slurmctld's RPC threads, whose stacks are 1 MiB, and on Python 3.11 this is what bounds a recursion
# through C (a RecursionError instead of a crash; worker.c wants half the stack left). Its calls
# are shallow.
RECURSION_LIMIT = 250
SLURM_HINT = "use --slots, --slots-per-node, --slot-type, --gpu-type or --resource-pool instead"


# ---- reading the request -------------------------------------------------------------------------
_BY_CONTROL = {o.env: o.name for o in OPTIONS}
_BY_SPANK = {o.spank_env: o.name for o in OPTIONS}
CONFIG_CHECK_SECONDS = 0.2   # how often the shim stat()s the config file to validate cached answers


def tether_values(spank_env: list[str]) -> dict[str, str]:
    """Option name -> value from spank_job_env: TETHER_<NAME> (the plugin's effective value, from
    the option or the environment) wins over Slurm's _SLURM_SPANK_OPTION_tether_<name>."""
    by_control, by_spank = _BY_CONTROL, _BY_SPANK
    control: dict[str, str] = {}
    spank: dict[str, str] = {}
    for entry in spank_env:
        key, _, value = entry.partition("=")
        if key in by_control:
            control[by_control[key]] = value
        elif key in by_spank:
            spank[by_spank[key]] = value
    return {**spank, **control}


def checked_values(values: dict[str, str]) -> dict[str, str]:
    """Every value as the SPANK plugin would have accepted it (flags normalized): a client that
    skipped sbatch's checks (libslurm is open to every user) gets the plugin's message here."""
    out = {}
    for name, value in values.items():
        opt = BY_NAME[name]
        normalized = normalize(opt, value)
        if normalized is None and opt.kind == "image":       # the parser's message has a hint
            from ..hooks.imageref import ImageRefError, parse_image
            try:
                parse_image(value)
            except ImageRefError as exc:
                raise RequestError(str(exc)) from None
        if normalized is None:
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise RequestError(f"{opt.flag}={shown}: expected {expected(opt)}" if opt.kind in ("count", "slot_type",
                               "runtime", "flag", "image") else f"{opt.flag}: expected {expected(opt)}")
        out[name] = normalized
    return out


def cstr(ffi, ptr) -> str | None:
    """A C string from the request snapshot (None for NULL; bytes that are not UTF-8 replaced)."""
    return ffi.string(ptr).decode("utf-8", "replace") if ptr != ffi.NULL else None


# The user's own options as slurmctld sees them: sbatch/srun turn --nodes into min_nodes, --gpus
# into tres_per_job, --gres/--gpus-per-node into tres_per_node, and so on.
def user_args(job, lib, ffi) -> list[Arg]:
    """The controlled options the user gave explicitly, as Args for the shared policy check."""
    args: list[Arg] = []

    # a count sbatch derived from --nodelist is not the user's --nodes (Slurm checks the list fits)
    derived = job.req_node_count and job.min_nodes == job.req_node_count and job.max_nodes in (
        lib.NO_VAL, 0, job.min_nodes)
    if job.min_nodes not in (lib.NO_VAL, 0) and not derived:
        nodes = str(job.min_nodes) + (f"-{job.max_nodes}" if job.max_nodes not in (lib.NO_VAL, 0, job.min_nodes)
                                      else "")
        args.append(Arg("--nodes", nodes, f"--nodes={nodes}"))
    # --ntasks-per-node first: sbatch derives num_tasks from it, and the user typed this one
    if job.ntasks_per_node not in (lib.NO_VAL16, 0):
        args.append(Arg("--ntasks-per-node", str(job.ntasks_per_node),
                        f"--ntasks-per-node={job.ntasks_per_node}"))
    if job.num_tasks not in (lib.NO_VAL, 0):
        args.append(Arg("--ntasks", str(job.num_tasks), f"--ntasks={job.num_tasks}"))
    if job.cpus_per_task not in (lib.NO_VAL16, 0):
        args.append(Arg("--cpus-per-task", str(job.cpus_per_task), f"--cpus-per-task={job.cpus_per_task}"))
    for attr, option in (("tres_per_job", "--gpus"), ("tres_per_task", "--gpus-per-task"),
                         ("tres_per_socket", "--gpus-per-socket"), ("tres_per_node", "--gres")):
        value = cstr(ffi, getattr(job, attr))
        if not value:
            continue
        gpu = [strip_gres_prefix(i) for i in value.split(",") if i and gres_references_gpu(i)]
        if gpu:
            if option != "--gres":                     # --gpus=2 arrives as gres:gpu:2
                gpu = [g.split(":", 1)[1] if ":" in g else g for g in gpu]
            shown = ",".join(gpu)
            given = f"--gres={shown} (or --gpus-per-node)" if option == "--gres" else f"{option}={shown}"
            args.append(Arg(option, shown, given))
    return args


# ---- writing the plan --------------------------------------------------------------------------
def gres_prefix(version_number: int) -> str:
    """TRES strings in job_desc: ``gres:gpu:2`` up to 23.05, ``gres/gpu:2`` from 23.11 (24.11 seen)."""
    return "gres/" if version_number >= (23 << 16) + (11 << 8) else "gres:"


def _put(ffi, job, field: str, value: str) -> None:
    """Store ``value`` in the fixed-size answer field ``out_<field>`` and mark it set."""
    data = value.encode()
    buf = getattr(job, "out_" + field)
    if len(data) >= len(buf):
        raise RequestError(f"the resulting {field} ({value[:60]}...) is longer than {len(buf) - 1} bytes")
    ffi.memmove(buf, data + b"\0", len(data) + 1)
    setattr(job, "set_" + field, 1)


# How a shaped answer's numbers follow the request's slot counts (bridge.h's TETHER_Q_*), and the
# answer's fields that carry the Plan's numbers.
Q_SAME, Q_SLOTS, Q_SPN, Q_NODES = 0, 1, 2, 3
QUANTITY = {ONE: Q_SAME, SLOTS: Q_SLOTS, SPN: Q_SPN, NODES: Q_NODES}
SHAPED_FIELDS = {"min_nodes": "min_nodes", "max_nodes": "max_nodes", "num_tasks": "ntasks",
                 "ntasks_per_node": "tasks_per_node", "cpus_per_task": "cpus_per_task",
                 "tres_per_job": "gpus", "tres_per_task": "gpus_per_task", "tres_per_node": "gpus_per_node"}


class PlanAnswer:
    """What a Plan writes into a job's answer, worked out once for every job it is the plan of: the
    node range, tasks and CPUs (``numbers``: the struct's fields and values), the GPUs as TRES
    (``gres:gpu[:type]:N`` / ``gres/gpu...`` by version), the partition and WCKey (``texts``, in
    apply order; the GPUs per node are merged with the job's own --gres when written), the options
    the plan sets (``controlled``: the user may not give them), the note for the user (``notes``)
    and the shape cache's quantities (``quantities``; None: not shaped, see mark_shaped). With an
    ``ffi``, the answer's fields as bytes too (``image``: the struct from ``set_nodes`` to ``msg``,
    and ``shape_image`` from ``shaped`` to its end), written into a job at once: a new shape's call
    in slurmctld runs with its code and data out of the CPU's caches, and each field set through
    cffi is code of its own."""

    __slots__ = ("numbers", "texts", "controlled", "notes", "quantities", "image", "shape_image")

    def __init__(self, plan: Plan, prefix: str, ffi=None):
        res = plan.slurm
        assert res is not None
        # what the answer holds in each of SHAPED_FIELDS (None: not written)
        answered = {"min_nodes": res.min_nodes, "max_nodes": res.max_nodes, "num_tasks": res.task_count,
                    "ntasks_per_node": res.tasks_per_node, "cpus_per_task": res.cpus_per_task,
                    "tres_per_job": res.gpus, "tres_per_task": res.gpus_per_task, "tres_per_node": res.gpus_per_node}
        numbers = [("set_nodes", 1), ("out_min_nodes", res.min_nodes), ("out_max_nodes", res.max_nodes)]
        for out in ("num_tasks", "ntasks_per_node", "cpus_per_task"):
            if answered[out] is not None:
                numbers += [("set_" + out, 1), ("out_" + out, answered[out])]
        self.numbers = tuple(numbers)
        gpu = prefix + "gpu:" + (f"{res.gpu_type}:" if res.gpu_type else "")
        texts = [(out, f"{gpu}{answered[out]}") for out in ("tres_per_job", "tres_per_task", "tres_per_node")
                 if answered[out] is not None]
        texts += [(out, text) for out, text in (("partition", plan.partition), ("wckey", plan.project)) if text]
        self.texts = tuple(texts)
        self.controlled = controlled_options(plan)
        self.notes = "\n".join(f"tether: note: {n}" for n in plan.notices)
        self.quantities = None if plan.notices else shape_quantities(plan, answered)
        self.image = self.shape_image = None
        if ffi is not None:           # the same writes, into a job of no --gres of its own
            scratch = ffi.new("tether_job_t *")
            self._write_fields(scratch, ffi)
            mark_shaped(scratch, self.quantities)
            start, end = ffi.offsetof("tether_job_t", "set_nodes"), ffi.offsetof("tether_job_t", "msg")
            shaped = ffi.offsetof("tether_job_t", "shaped")
            whole = ffi.buffer(scratch)
            self.image, self.shape_image = whole[start:end], whole[shaped:]

    def _write_fields(self, job, ffi) -> None:
        for name, value in self.numbers:
            setattr(job, name, value)
        for out, text in self.texts:
            if out == "tres_per_node":        # the job's own --gres stays, but for its GPUs
                current = cstr(ffi, job.tres_per_node) or ""
                text = ",".join([i for i in current.split(",") if i and not gres_references_gpu(i)] + [text])
            _put(ffi, job, out, text)
        job.set_requeue, job.out_requeue = 1, 0

    def write(self, job, ffi) -> None:
        """Fill ``job``'s answer: the plan's fields, and no requeue."""
        if self.image is None or job.tres_per_node != ffi.NULL:    # a --gres of its own: merged
            self._write_fields(job, ffi)
        else:
            ffi.memmove(ffi.addressof(job, "set_nodes"), self.image, len(self.image))

    def mark(self, job, ffi) -> None:
        """mark_shaped(job, self.quantities), from ``shape_image`` when there is one."""
        if self.shape_image is None:
            mark_shaped(job, self.quantities)
        else:
            ffi.memmove(ffi.addressof(job, "shaped"), self.shape_image, len(self.shape_image))


def apply_plan(job, plan: Plan, ffi, prefix: str) -> None:
    """Fill the answer from the Plan's fields: node range, tasks, CPUs/GPUs, partition, WCKey, and
    no requeue (PlanAnswer)."""
    PlanAnswer(plan, prefix).write(job, ffi)


def shape_quantities(plan: Plan, answered: dict[str, int | None]) -> dict[str, int] | None:
    """How the numbers of a plan's answer (``answered``: SHAPED_FIELDS' values as written, None when
    not) follow the request's slot counts: the quantities of the plan's table row
    (docs/requirements.md, "Slurm resource calculations": slots, slots per node, nodes = slots /
    slots per node, or fixed), each checked against the answer itself; None when one does not check
    out (the answer is then not shaped)."""
    assert plan.slurm is not None
    sets = {field: QUANTITY[q] for field, q, _ in ROWS[plan.row].sets if getattr(plan.slurm, field) is not None}
    if plan.slurm.ntasks is None and plan.slurm.gpus and plan.slurm.gpus_per_task:
        sets["ntasks"] = Q_NODES              # sbatch's own: --gpus / --gpus-per-task
    spn = plan.slots_per_node or 1
    value = {Q_SLOTS: plan.slots, Q_SPN: spn, Q_NODES: plan.slots // spn}
    quantities = {}
    for out, field in SHAPED_FIELDS.items():
        q = sets.get(field, Q_SAME)
        if q == Q_SAME:
            continue
        if answered[out] != value[q]:        # a TRES string ends in ":<its number>"
            return None
        quantities[out] = q
    return quantities


def mark_shaped(job, quantities: dict[str, int] | None) -> None:
    """Mark an accepted answer as every request's of its shape (the C shim's shape cache, cache.h):
    the same request with other slot counts or another valid image gets the same answer, its numbers
    following the counts by ``quantities`` (shape_quantities; {}: none follows them). An answer with
    a note for the user, or one that does not check out (None), is not shaped."""
    if quantities is None:
        return
    for out, q in quantities.items():       # the others stay Q_SAME: the answer starts zeroed (calloc)
        setattr(job, "q_" + out, q)
    job.shaped = 1


def controlled_options(plan: Plan) -> list[str]:
    """The sbatch options this plan sets (the user may not give them)."""
    assert plan.slurm is not None
    return [SLURM_FIELD_OPTIONS[name] for name, value in vars(plan.slurm).items()
            if name in SLURM_FIELD_OPTIONS and value is not None]


def gateway_component(job, values: dict[str, str], config: Config, lib, ffi) -> int:
    """Make a heterogeneous job's component asking ``--gateways=N`` the gateway nodes: N nodes of
    the config's gateway partition (and feature), one task each. Returns N; RequestError when the
    request cannot be one."""
    count = int(values["gateways"])
    settings = config.data["gateways"]
    if not settings["partition"]:
        raise RequestError("--gateways: this cluster has no gateway nodes (tether's configuration names no "
                           "gateways.partition)")
    if job.het_job_offset in (lib.NO_VAL, 0):
        raise RequestError(f"--gateways={count}: gateway nodes are a component of their own in a heterogeneous "
                           f"job, after the job's other components (sbatch: a '#SBATCH hetjob' line, then "
                           f"'#SBATCH --gateways={count}'; salloc: '... : --gateways={count}'); Slurm cannot "
                           f"add nodes of another partition to a job any other way")
    others = [opt.flag for opt in OPTIONS if opt.name in values and opt.name != "gateways"]
    if others:
        raise RequestError(f"--gateways={count} makes its component the gateway nodes; {', '.join(others)} "
                           f"belong(s) in another component of the job")
    given = user_args(job, lib, ffi)
    if given:
        raise RequestError(f"{given[0].given} conflicts with --gateways={count}, which sets the component's "
                           f"nodes and tasks (one task per gateway node); remove it")
    partition = cstr(ffi, job.partition)
    if partition and partition != settings["partition"]:
        raise RequestError(f"--partition={partition} conflicts with --gateways={count}: the gateway nodes are "
                           f"partition {settings['partition']}; remove --partition")
    feature, constraint = settings["feature"], cstr(ffi, job.features)
    if feature and constraint and not all(c.isalnum() or c in "._-&" for c in constraint):
        raise RequestError(f"--constraint={constraint}: with --gateways, only features joined with '&' "
                           f"(tether adds the gateway feature {feature})")
    job.set_nodes, job.out_min_nodes, job.out_max_nodes = 1, count, count
    job.set_num_tasks, job.out_num_tasks = 1, count
    job.set_ntasks_per_node, job.out_ntasks_per_node = 1, 1
    _put(ffi, job, "partition", settings["partition"])
    if feature:
        _put(ffi, job, "features", f"{constraint}&{feature}" if constraint else feature)
    return count


# ---- the handler ---------------------------------------------------------------------------------
_NEVER = ("never",)      # a stamp no file has: nothing loaded or refused yet
PLAN_ANSWERS = 256       # plans' answers kept (about 1.3 KB each, with their keys), then forgotten at once
SLOT_NAMES = frozenset(opt.name for opt in SLOT_OPTIONS)


class Handler:
    """State kept across calls: the last good config and what file it came from."""

    def __init__(self, ffi, lib, env: dict[str, str] | None = None):
        self.ffi, self.lib = ffi, lib
        # required: named by $TETHER_CONFIG, so it must exist (a missing one is an error, never the
        # built-in defaults); the default /etc/tether/tether.yaml may be absent
        self.path, self.required = config_path(None, os.environ if env is None else env)
        self.config: Config | None = None
        # (inode, mtime, size) of the file last loaded / last refused; None: the file is missing
        self._stamp: tuple | None = _NEVER
        self._bad_stamp: tuple | None = _NEVER
        self.prefix = gres_prefix(lib.SLURM_VERSION_NUMBER)
        self.reason = "not initialized"
        # slurm.conf's partitions' sizes, for the note at submit (the C shim compares them)
        self.slurm_conf = slurm_conf_path(os.environ if env is None else env)
        self._partitions_stamp: tuple | None = _NEVER
        # plan_answer's: the answers (or refusals) of the plans made with config _answers_config
        self._answers: dict[tuple, PlanAnswer | str] = {}
        self._answers_config: Config | None = None

    # -- logging and health --
    def log(self, level: int, message: str) -> None:
        for line in message.splitlines() or [""]:
            self.lib.tether_log(level, line.encode("utf-8", "replace"))

    def _health(self, broken: bool, reason: str, reject_all: bool = False) -> None:
        self.reason = reason
        self.lib.tether_set_health(int(broken), int(reject_all), reason.encode("utf-8", "replace")[:500])

    # -- config --
    def read_partitions(self) -> None:
        """slurm.conf's partitions' node counts to the C shim (its note for a job planned on more
        nodes than its partition has), read again when the file changed."""
        try:
            st = os.stat(self.slurm_conf)
        except OSError:
            st = None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size) if st else None
        if stamp == self._partitions_stamp:
            return
        try:
            table = partition_table(self.slurm_conf) if st else "\n"
        except Exception as exc:          # a note is not worth a refused job: no sizes, said once
            self.log(0, f"cannot count the partitions' nodes in {self.slurm_conf} (no note at submit): "
                        f"{type(exc).__name__}: {exc}")
            table = "\n"
        self.lib.tether_partitions_loaded(self.slurm_conf.encode(), int(st is not None), st.st_ino if st else 0,
                                          st.st_size if st else 0, st.st_mtime_ns if st else 0,
                                          table.encode("utf-8", "replace"))
        self._partitions_stamp = stamp

    def refresh(self) -> Config | None:
        """Re-read the config if its file changed; keep the last good one if the new one is bad.
        (Called only when the shim's answers cache cannot answer; the shim re-checks the file at
        most every CONFIG_CHECK_SECONDS and asks again when it changed.)"""
        self.read_partitions()
        try:
            st = os.stat(self.path)
            stamp: tuple | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            self.lib.tether_config_loaded(self.path.encode(), 1, st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
            self.lib.tether_config_loaded(self.path.encode(), 0, 0, 0, 0)
        except OSError as exc:
            stamp = ("error", str(exc))
        if self.config is not None and stamp == self._stamp:
            return self.config
        if stamp == self._bad_stamp:
            return self.config
        try:
            config = load_config(self.path if stamp is not None or self.required else None, env={})
        except ConfigError as exc:
            self._bad_stamp = stamp
            if self.config is None:
                self._health(True, f"bad configuration {self.path}: {exc.problems[0]}",
                             reject_all=_on_failure_of_broken(self.path) == "reject_all_jobs")
            self.log(0, f"configuration not loaded{' (keeping the last good one)' if self.config else ''}:"
                        f"\n{exc}")
            return self.config
        self.config, self._stamp, self._bad_stamp = config, stamp, None
        _users.clear()        # a uid given to another user since: their name (the answers are new too)
        # the user matters to an answer only where the WCKey is named after them (plan_answer's key)
        self.lib.tether_answers_per_user(int(config.job_project_source == "user"))
        self._health(False, "")
        self.log(1, f"configuration loaded from {config.source}")
        return config

    def init(self) -> int:
        return ACCEPT if self.refresh() is not None else REJECT

    # -- submit --
    def submit(self, job, submit_uid: int, wanted: int) -> int:
        # the shim checked the file a moment ago (its answers cache does, at most every 0.2 s):
        # no stat() of our own then -- a cold call's Python time is what a distinct job costs
        if job.direct and not (job.config_current and self.config is not None):
            return ON_WORKER      # a config to read: the worker's (worker.c), not slurmctld's thread
        config = self.config if job.config_current and self.config is not None else self.refresh()
        if config is None:        # a tether job, or any job with plugin.on_failure: reject_all_jobs
            self._reply(job, f"tether unavailable: {self.reason}")
            return REJECT
        if not wanted:            # reached only in reject_all mode, and the config loads again
            return ACCEPT
        try:
            values = self.request_values(job)
            check_container_options(values, config.data["container"]["runtime"], normalized=True,
                                    plain_mounts=bool(job.plain_mounts))   # set only with job.values
        except (LaunchError, RequestError) as exc:
            self._reply(job, f"tether: {exc}")
            job.cacheable = 1
            return REJECT
        if "gateways" in values:
            try:
                gateways = gateway_component(job, values, config, self.lib, self.ffi)
            except RequestError as exc:
                self._reply(job, f"tether: {exc}")
                job.cacheable = 1
                return REJECT
            self._reply(job, f"tether: note: component {job.het_job_offset}: {gateways} gateway node(s) in "
                             f"partition {config.data['gateways']['partition']}; the batch script starts "
                             f"their daemon and finds them in $TETHER_GATEWAYS (salloc: eval \"$(tether "
                             f"gateway start)\")")
            job.cacheable = 1
            return ACCEPT
        if values.keys().isdisjoint(SLOT_NAMES):
            job.cacheable = 1                   # container options only: checked, nothing planned
            mark_shaped(job, {})
            return ACCEPT
        try:
            answer = self.plan_answer(job, values, config)
            conflicts = user_args(job, self.lib, self.ffi)
            if conflicts:
                check_slurm_args(conflicts, answer.controlled, script=False, source="", hint=SLURM_HINT)
            answer.write(job, self.ffi)
        except RequestError as exc:
            self._reply(job, f"tether: {exc}")
            self.log(2, f"rejected a job of uid {submit_uid}: {exc}")
            job.cacheable = 1
            return REJECT
        except _MayBlock:         # before anything is written into the answer
            return ON_WORKER
        if answer.notes:
            self._reply(job, answer.notes)
        job.cacheable = 1
        answer.mark(job, self.ffi)
        return ACCEPT

    def plan_answer(self, job, values: dict[str, str], config: Config) -> PlanAnswer:
        """The answer of the plan for a job's slot request (RequestError when it has none), kept for
        what the plan is made of: the slot options, the partition, and the account or the user
        where job_project_source names them -- up to PLAN_ANSWERS, while the config is the same.
        A job of a new shape (its other options new to the C shim's shape cache: a --container-env,
        another user) mostly asks for a plan made before."""
        if self._answers_config is not config:
            self._answers.clear()
            self._answers_config = config
        source = config.job_project_source
        partition = self._text(job.partition)
        key = (values.get("slots"), values.get("slots-per-node"), values.get("slot-type"), values.get("gpu-type"),
               values.get("resource-pool"), partition,
               self._text(job.account) if source == "account" else job.user_id if source == "user" else None)
        answer = self._answers.get(key)
        if answer is None:
            try:
                request = self.request(job, values, partition, user=source == "user", may_block=not job.direct)
                answer = PlanAnswer(make_plan(request, config, "slurm"), self.prefix, self.ffi)
            except RequestError as exc:
                answer = str(exc)
            if len(self._answers) >= PLAN_ANSWERS:
                self._answers.clear()           # cheaper than keeping the most used, and rare
            self._answers[key] = answer
        if isinstance(answer, str):
            raise RequestError(answer)
        return answer

    def request(self, job, values: dict[str, str], partition: str | None, *, user: bool = True,
                may_block: bool = True) -> Request:
        """The Request for a job from its tether options, its partition and its other fields (its
        user's name with ``user``: only job_project_source ``user`` uses it; looked up only with
        ``may_block`` when not known yet, else _MayBlock)."""
        slots = int(values["slots"]) if "slots" in values else None
        if slots is None:
            given = next(opt.flag for opt in SLOT_OPTIONS if opt.name in values)
            raise RequestError(f"{given} needs --slots (how many slots the job uses)")
        pool = values.get("resource-pool")
        if pool and partition and pool != partition:
            raise RequestError(f"--partition={partition} conflicts with --resource-pool={pool}; "
                               f"give one of them")
        return Request(
            slots=slots, slots_per_node=int(values["slots-per-node"]) if "slots-per-node" in values else None,
            slot_type=values.get("slot-type"), gpu_type=values.get("gpu-type"),
            resource_pool=pool or partition or None, job_type="slurm",
            job_id="submit", account=self._text(job.account) or None,
            user=_user_name(job.user_id, may_block) if user else None, origin="slurm",
        )

    # -- modify --
    def modify(self, update, current, submit_uid: int) -> int:
        """scontrol update of a tether job (``current`` is a copy of its record): layout and GPU
        changes are refused; a partition change is re-planned when the job keeps its table row,
        refused otherwise. A refusal's reason goes to slurmctld's log and into the update's message,
        which Slurm 23.02 and later hand to the user (``scontrol: error: tether: ...``); 22.05 has no
        way to (the user sees "Requested operation not supported on this system")."""
        job = f"tether job {self._text(update.job_id_str) or update.job_id}"

        def refuse(why: str, *, partition: str | None = None, by_uid: bool = False) -> int:
            to = f" to partition {partition}" if partition else ""
            self.log(1, f"update of {job}{f' by uid {submit_uid}' if by_uid else ''}{to} refused: {why}")
            self._reply(update, f"tether: update{to} refused: {why}")
            return REJECT
        config = self.refresh()
        if config is None:
            return refuse(f"tether unavailable: {self.reason}")
        try:
            values = checked_values(tether_values(self._strings(current.spank_env, current.spank_env_size)))
        except RequestError as exc:             # a job submitted before tether checked it
            return refuse(str(exc))
        if not any(opt.name in values for opt in SLOT_OPTIONS):
            return ACCEPT                       # container options only: tether planned nothing
        changed = [a.given for a in user_args(update, self.lib, self.ffi)]
        if changed:
            why = (f"{', '.join(changed)} would override the layout tether planned from --slots (cancel "
                   f"and resubmit with other --slots/--slots-per-node instead)")
            return refuse(why, by_uid=True)
        partition = self._text(update.partition)
        if partition is None:
            return ACCEPT
        values.pop("resource-pool", None)       # the new partition is the resource pool now
        try:
            user = config.job_project_source == "user"
            before = make_plan(self.request(current, values, self._text(current.partition), user=user), config,
                               "slurm")
            plan = make_plan(self.request(current, values, partition, user=user), config, "slurm")
        except RequestError as exc:
            return refuse(str(exc), partition=partition)
        if plan.row != before.row:
            why = f"it would change the job from {before.row} to {plan.row} (slot type); cancel and resubmit"
            return refuse(why, partition=partition)
        try:
            apply_plan(update, plan, self.ffi, self.prefix)
        except RequestError as exc:
            return refuse(str(exc), partition=partition)
        self.log(1, f"{job} re-planned for partition {partition}: {plan.slurm}")
        return ACCEPT

    # -- helpers --
    def request_values(self, job) -> dict[str, str]:
        """The job's tether options, checked (option name -> value): as the shim's C read and
        checked them (``job.values``, job_submit/request.c), or -- where it did not (a value it
        refuses, or one that is not UTF-8) -- read from spank_env here, RequestError naming what
        is wrong."""
        if job.values != self.ffi.NULL:
            parts = self.ffi.unpack(job.values, job.values_size).decode("utf-8").split("\0")
            return dict(zip(parts[0:-1:2], parts[1::2]))
        return checked_values(tether_values(self._strings(job.spank_env, job.spank_env_size)))

    def _text(self, ptr) -> str | None:
        return cstr(self.ffi, ptr)

    def _strings(self, array, size: int) -> list[str]:
        if not size:                  # an empty array may be NULL, which unpack() refuses
            return []
        string, null = self.ffi.string, self.ffi.NULL
        return [string(p).decode("utf-8", "replace") for p in self.ffi.unpack(array, size) if p != null]

    def _reply(self, job, text: str) -> None:
        """The message for the user (a rejection's reason, or notes), truncated to fit."""
        data = text.encode("utf-8", "replace")[: len(job.msg) - 1]
        self.ffi.memmove(job.msg, data + b"\0", len(data) + 1)


def _on_failure_of_broken(path: str) -> str | None:
    """plugin.on_failure from a config file that failed validation, if that one key is readable:
    a site that asked to reject all jobs while tether is unavailable gets that even then."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        value = data["plugin"]["on_failure"]
    except Exception:  # any unreadable shape means "not stated"
        return None
    return value if value in ON_FAILURE else None


class _MayBlock(Exception):
    """What the answer needs may block (an NSS lookup): not on slurmctld's own thread (ON_WORKER)."""


_users: dict[int, str | None] = {}     # uid -> name, until the config is loaded again (refresh)


def _user_name(uid: int, may_block: bool = True) -> str | None:
    """The submitting user's name, kept as the answers made with it are: until the config is
    loaded again (NSS lookups can be slow, and may hang); _MayBlock when not known and not
    ``may_block``."""
    if uid not in _users:
        if not may_block:
            raise _MayBlock
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = None
    return _users[uid]


# ---- entry points bound by the cffi init code (build.py) ----------------------------------------
_handler: Handler | None = None


def bind(ffi, lib) -> Handler:
    """Create the process-wide handler (called once by the embedded init code)."""
    global _handler
    _handler = Handler(ffi, lib)
    return _handler


def call(method: str, *args) -> int:
    """Run a handler method; any exception is logged with its traceback and returns FAILED."""
    try:
        if _handler is None:
            return FAILED
        return getattr(_handler, method)(*args)
    except Exception as exc:  # the daemon must survive anything the handler does
        if _handler is not None:
            _handler.log(0, f"internal error in {method}:\n{_traceback(exc)}")
        return FAILED


def _traceback(exc: BaseException) -> str:
    """``exc`` and where it was raised, without reading a file (no import, no source lines: this
    may run on slurmctld's own thread, with its locks held, and the sources may be on a slow
    filesystem)."""
    lines = ["Traceback (most recent call last):"]
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        tb = tb.tb_next
    lines.append(f"{type(exc).__name__}: {exc}")
    return "\n".join(lines)

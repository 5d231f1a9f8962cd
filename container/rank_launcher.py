"""The C rank launcher, ``tether-run`` (container/tether_run.c): built at install with the
configuration baked in.

slurmstepd hands every task of a container step to ``tether-run``. For the common case -- podman,
a rootfs directory, no other container option -- it plans and supervises the container itself, as
the Python launcher would (``Podman.launch`` and ``launch._supervise``), without starting Python;
everything else it hands to the Python launcher (``tether-run-py``, tether.container.run) before
anything ran, and a run that did not end cleanly it hands over to be concluded (see
``run.RESUME_VAR``). Why: a Python process per rank cost ~12 ms of CPU before podman started; a
containerized ``srun -N3`` was 1.07x the same podman under srun, and is 1.00x with this launcher.

What it must agree with Python on -- the names that enter the container, podman's arguments, the
cleanup marker -- comes from the Python modules themselves, written into ``tether_run_baked.h``
here: podman's arguments, the container's name, its id file and the cleanup marker are
``Podman.launch`` itself, run here with the answers of the common case and placeholders for the
rank's values (``RankTemplate``), which tether-run substitutes; tether-run decides only whether a
rank is that case and supervises it. tests/unit/test_rank_launcher.py builds it with ``plan_only``
and compares its plans with ``Podman.launch``'s over many rank environments.

The common enroot rank it runs too: the step's ``enroot create`` (``ahead_plan``) and the
``enroot start`` with its scripts and start turn (``start_plan``), ``Enroot.launch``'s own, baked the
same way; a rank of that case it cannot run (a value enroot's environment file cannot carry, MPI's
PMI_FD) gets the create started before the hand-over.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..hooks import layout
from ..hooks.layout import CLEANUP_MARKER
from ..hooks.surface import BY_NAME, MAX_TEXT, c_env_names
from ..system.toolchain import CBuild
from . import environment
from .launch import GRACE_SECONDS
from .run import config_identity
from .runtimes.enroot import CREATE_QUIET_SECONDS
from .runtimes.podman import DEFAULT_STORE, PAUSE_NAMES, PAUSE_PID_FILE, ROOTFS_TARGETS, Podman
from .spec import CONTAINER_TMP, CONTAINER_WORKDIR, LaunchError, LaunchSpec

RANK_LAUNCHER_SOURCE = Path(__file__).with_name("tether_run.c")
FD_HELPER_SOURCE = Path(__file__).with_name("tether_fd_receive.c")
BAKED_HEADER = "tether_run_baked.h"


class _WithRankDir:
    """What ``environment.overrides`` reads of a launch spec: a rank that has its directories."""
    rank_dir = "/"


def c_string(value: str) -> str:
    """``value`` as a C string literal (octal escapes for anything but printable ASCII)."""
    out = []
    for byte in value.encode("utf-8", "surrogateescape"):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7f:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def c_list(values: Sequence[str]) -> str:
    return "{" + ", ".join([*(c_string(v) for v in values), "NULL"]) + "}"


# The rank's values in the C launcher's templates: '\1' and a letter, substituted by tether-run
# (tether_run.c: expand); COMMAND is a whole argument that stands for the command's arguments.
PLACEHOLDERS = {
    "JOB": "\1J", "STEP": "\1S", "RANK": "\1K",
    "STEP_DIR": "\1D", "RANK_NAME": "\1B",      # the rank directory is STEP_DIR/RANK_NAME
    "IMAGE": "\1I",                             # the rootfs directory
    "STORE": "\1T", "RUN_DIR": "\1U",          # the user's podman store, podman's run directory
    "NAMES_FD": "\1F",                          # the --env-file memfd's number
    "COMMAND": "\1C",
    "PARTIAL": "\1P",                          # enroot create's partial name (CreateWhole.partial),
    "PID": "\1Q",                              # made of the creating process's id
    "USER_RUN_DIR": "\1R",                     # the user's run directory (Enroot.own_run_dir)
    "ENV_LINES": "\1E",                        # the job's variables in enroot's --conf script
}


class RankTemplate(Podman):
    """``Podman.launch`` for the C launcher's case, with placeholders for what only the rank knows:
    a rootless rank, no terminal, the rootfs directory as it is (``rootfs_argv``), this
    configuration's store at the store's placeholder, the names file at its fd's -- and /dev/mqueue
    as asked (two templates: tether-run looks at the node)."""

    def __init__(self, settings: Mapping[str, Any], *, mqueue: bool, **kw):
        super().__init__(settings, **kw)
        self.mqueue = mqueue

    @staticmethod
    def as_root() -> bool:
        return False

    @staticmethod
    def terminal() -> bool:
        return False

    def node_mqueue(self) -> bool:
        return self.mqueue

    @staticmethod
    def names_fd(names) -> int:
        return -1

    def store_paths(self, *, create: bool = False, uid: int | None = None) -> tuple[str, str] | None:
        return (PLACEHOLDERS["STORE"], PLACEHOLDERS["RUN_DIR"]) if self.store_template else None

    def image_plan(self, spec, glob, mounts=None):
        return self.rootfs_argv(spec.image, bool(spec.writable)), []

    def mark_used(self, name: str) -> None:
        raise AssertionError("a rootfs directory has no store image")

    @classmethod
    def plan(cls, settings: Mapping[str, Any], *, mqueue: bool) -> dict[str, Any]:
        """The templates of one launch: argv, container name, id file, marker path and content."""
        podman = settings.get("podman") or {}
        runtime = cls(podman, mqueue=mqueue, environment=settings.get("environment") or environment.DEFAULT_MODE)
        P = PLACEHOLDERS
        spec = LaunchSpec(image=P["IMAGE"], runtime="podman", command=(P["COMMAND"],),
                          rank_dir=f"{P['STEP_DIR']}/{P['RANK_NAME']}", job_id=P["JOB"], step_id=P["STEP"],
                          rank=P["RANK"], writable=False)
        # one variable passed by name: the names file is in the plan (a Slurm task always has some)
        launch = runtime.launch(spec, {"SLURM_PROCID": "0"})
        if launch.before or launch.prepare or launch.after or launch.finish or not launch.supervise:
            raise AssertionError(f"the C launcher's case is no plain podman run: {launch!r}")
        argv = [a.replace("/dev/fd/-1", f"/dev/fd/{P['NAMES_FD']}") for a in launch.argv]
        return {"argv": argv, "container": launch.container, "created": launch.created,
                "marker": launch.marker,
                # placeholders as they are, not JSON's \u0001 (the values put there are plain ids)
                "marker_data": json.dumps(launch.marker_data).replace("\\u0001", "\1")}


# recognizable values for a rank's, which the bakes below turn into placeholders
BAKED_JOB, BAKED_STEP, BAKED_RANK = "7310000001", "7310000002", "7310000003"


def _scratch_rank(tmp: str) -> tuple[str, str, str, dict[str, str]]:
    """A rank of an enroot step in scratch directory ``tmp``: (step directory, rank directory,
    image file, the rank's environment: ids, directory, image)."""
    step_dir = os.path.join(tmp, "step-dir")
    rank_dir = os.path.join(step_dir, "rank-dir-7310000004")
    for sub in ("tmp", "work"):
        os.makedirs(os.path.join(rank_dir, sub))
    image = os.path.join(tmp, "image.sqsh")
    open(image, "w").close()
    return step_dir, rank_dir, image, {"SLURM_JOB_ID": BAKED_JOB, "SLURM_STEP_ID": BAKED_STEP,
                                       "SLURM_PROCID": BAKED_RANK, "SLURM_LOCALID": "0",
                                       "TETHER_RANK_DIR": rank_dir, "TETHER_CONTAINER_IMAGE": image}


def ahead_plan(settings: Mapping[str, Any]) -> dict[str, Any] | str:
    """The enroot create that tether-run starts ahead of the Python launcher (tether_run.c:
    create_ahead), as templates; or why a rank of this configuration gets none.

    The common enroot rank -- a squashfs file, no container option but the image (and the runtime,
    when enroot is not the default) -- spends ~30 ms
    in the Python launcher before its ``enroot create`` (unsquashfs of the image into the step's
    container root, ~0.1 s for a small one) starts: tether-run starts that create itself, under the
    Python launcher's lock, and hands the rank over at once; the Python launcher, which waits for
    the lock, finds the root made (or makes it itself when that failed). What the create is comes
    from ``Enroot.launch`` itself: run here, in a scratch directory, for such a rank with
    recognizable values for the rank's, which become placeholders: its first preparation step
    (``CreateWhole``), its lock, and what it adds to the runtime's environment."""
    from .run import runtime_for
    from .runtimes.enroot import CreateWhole
    from .spec import spec_from_env

    job, step, rank = BAKED_JOB, BAKED_STEP, BAKED_RANK
    with tempfile.TemporaryDirectory(prefix="tether-run-ahead-") as tmp:
        step_dir, rank_dir, image, env = _scratch_rank(tmp)
        run_dir = os.path.join(tmp, "user-run-dir")         # the user's run directory (own_run_dir)
        try:
            spec = spec_from_env(env, ["true"], default_runtime="enroot", defaults=settings)
            runtime = runtime_for("enroot", settings)
            # the launch without the user's run directory, then with it: the C launcher looks
            launches = []
            for run_dir_now in (None, run_dir):
                runtime.own_run_dir = lambda: run_dir_now             # type: ignore[method-assign]
                launches.append(runtime.launch(spec, env))
            without_run_dir, launch = launches
        except (LaunchError, OSError, ValueError, KeyError) as exc:      # never a failed install
            return f"a plain enroot rank's launch fails here ({exc})"
        base = runtime.base_env(env)
        create = launch.before[0][0] if launch.before else None
        if not isinstance(create, CreateWhole) or create.name != spec.step_instance or create.marker:
            return "an enroot rank of this configuration has a container root of its own"
        if launch.before[0][1] != os.path.join(create.data, create.name) or not launch.lock:
            return "an enroot create without its usual check or lock"

        def template(value: str) -> str:
            for text, placeholder in ((step_dir, "\1D"), (run_dir, "\1R"), (image, "\1I"), (job, "\1J"),
                                      (step, "\1S"), (rank, "\1K")):
                value = value.replace(text, placeholder)
            if tmp in value:
                raise AssertionError(f"a scratch path left in the ahead plan: {value!r}")
            return value

        added = {n: v for n, v in launch.env.items() if n not in base}
        added_without = {n: v for n, v in without_run_dir.env.items() if n not in base}
        return {"argv": [template(a) for a in create.argv(PLACEHOLDERS["PARTIAL"])],
                "remove": [template(a) for a in create.remove_argv(PLACEHOLDERS["PARTIAL"])],
                "name": template(create.name), "partial": template(create.partial(PLACEHOLDERS["PID"])),
                "data": template(create.data), "lock": template(launch.lock),
                "added": [f"{n}={template(v)}" for n, v in added.items()],
                "added_without_run_dir": [f"{n}={template(v)}" for n, v in added_without.items()],
                "runtime_env": [f"{k}={str(v)}" for k, v in runtime.runtime_env.items()],   # base_env's
                "binary": runtime.binary, "default": settings.get("runtime", "podman") == "enroot",
                "timeout": CreateWhole.TIMEOUT, "remove_timeout": CreateWhole.REMOVE_TIMEOUT}


def start_plan(settings: Mapping[str, Any]) -> dict[str, Any] | str:
    """The common enroot rank run by tether-run itself (tether_run.c: enroot_plan, enroot_before),
    as templates; or why a rank of this configuration goes to the Python launcher.

    The rank of ``ahead_plan``'s case without a terminal, PMI_FD or ROCm GPUs: after the create
    (ahead_plan's), ``Enroot.launch``'s ``enroot start`` -- its argv, its ``--conf`` script (the
    job's variables are the ``ENV_LINES`` placeholder: tether-run writes them as write_environ_conf
    does, and hands a rank with a value that needs more to Python), the start
    turn's lock and the file that ends it (``StartTurn``) -- run here for such a rank with
    recognizable values that become placeholders, without GPUs and with CUDA's."""
    from .run import runtime_for
    from .runtimes.enroot import CreateWhole, StartTurn, conf_line
    from .spec import spec_from_env

    P = PLACEHOLDERS
    # what Enroot.launch does per rank beyond the bake's one variable: the variables set after the
    # entrypoint (entrypoint_split: by name), the admin's mounts' sources (run.check_mount_sources)
    for key in ("entrypoint", "mounts"):
        if settings.get(key):
            return f"container.{key} is set"
    job, step, rank = BAKED_JOB, BAKED_STEP, BAKED_RANK
    with tempfile.TemporaryDirectory(prefix="tether-run-start-") as tmp:
        step_dir, rank_dir, image, rank_env = _scratch_rank(tmp)
        # one variable of the job's (it stands for them all) and the rank's own
        host = {"TETHER_BAKED_VARIABLE": "7310000005"}
        plans = []
        for gpus in ("", "0"):
            env = {**rank_env, "TETHER_SLOT_IDS": gpus}
            try:
                spec = spec_from_env(env, [P["COMMAND"]], default_runtime="enroot", defaults=settings)
                runtime = runtime_for("enroot", settings)
                runtime.own_run_dir = lambda: None              # type: ignore[method-assign]
                launch = runtime.launch(spec, host)
            except (LaunchError, OSError, ValueError, KeyError) as exc:      # never a failed install
                return f"a plain enroot rank's launch fails here ({exc})"
            kinds = [type(step[0]) for step in launch.before]
            if kinds != [CreateWhole, StartTurn] or launch.after or launch.finish or launch.prepare \
                    or not launch.supervise or launch.fds or launch.marker or launch.container or launch.runtime_own:
                return "an enroot rank of this configuration needs more than a create and a start"
            argv = list(launch.argv)
            try:
                conf = argv[argv.index("--conf") + 1]
            except (ValueError, IndexError):
                return "an enroot start without its --conf script"
            with open(conf, encoding="utf-8") as fh:
                conf_text = fh.read()
            line = conf_line("TETHER_BAKED_VARIABLE=7310000005")
            if conf_text.count(line) != 1 or "7310000005" in conf_text.replace(line, ""):
                return "the job's variables are not where tether-run writes them in enroot's --conf script"
            plans.append({"argv": argv, "conf_path": conf, "conf": conf_text.replace(line, P["ENV_LINES"]), "created": launch.created,
                          "start_lock": launch.before[1][0].lock, "started": launch.before[1][0].started})
        without, cuda = plans
        if {k: v for k, v in without.items() if k != "conf"} != {k: v for k, v in cuda.items() if k != "conf"}:
            return "an enroot rank with GPUs starts otherwise than one without"
        if without["started"] != without["created"]:
            return "the start turn ends otherwise than when the command runs"

    def template(value: str) -> str:
        for text, placeholder in ((rank_dir, f"{P['STEP_DIR']}/{P['RANK_NAME']}"), (step_dir, P["STEP_DIR"]),
                                  (image, P["IMAGE"]), (job, P["JOB"]), (step, P["STEP"]), (rank, P["RANK"])):
            value = value.replace(text, placeholder)
        if tmp in value:
            raise AssertionError(f"a scratch path left in the start plan: {value!r}")
        return value

    return {"argv": [template(a) for a in without["argv"]], "conf_path": template(without["conf_path"]),
            "conf": template(without["conf"]), "conf_cuda": template(cuda["conf"]),
            "created": template(without["created"]), "start_lock": template(without["start_lock"])}


def why_not_fast(settings: Mapping[str, Any]) -> str | None:
    """Why no rank of this configuration can take the C path (None: the common case can)."""
    if settings.get("runtime", "podman") != "podman":
        return f"the default runtime is {settings.get('runtime')}"
    for key in ("mounts", "mount_home", "remap_root", "entrypoint", "writable"):
        if settings.get(key):
            return f"container.{key} is set"
    if (settings.get("environment") or environment.DEFAULT_MODE) not in environment.MODES:
        return "an unknown container.environment"
    return None


def baked_header(config_path: str | None, settings: Mapping[str, Any], python_launcher: str, *,
                 bake_identity: bool = True, grace: float = GRACE_SECONDS) -> str:
    """The C header tether_run.c includes: this configuration and the contract's names. Without
    ``bake_identity``, as if the config file did not exist (see ``run.launcher_text``). ``grace``:
    how long the launcher waits for what the runtime left, launch.py's (a test build shortens it)."""
    podman = settings.get("podman") or {}
    runtime_env = {str(k): str(v) for k, v in (podman.get("env") or {}).items()}
    store = podman.get("store", DEFAULT_STORE) or ""
    # what the Python launcher compares too
    identity = config_identity(config_path) if bake_identity else None
    why = why_not_fast(settings)
    mode = settings.get("environment") or environment.DEFAULT_MODE
    own = tuple(environment.overrides(_WithRankDir()))       # tether's own values in a rank with its directories
    plans = [RankTemplate.plan(settings, mqueue=m) for m in (False, True)] if why is None else []
    ahead = ahead_plan(settings)
    ahead_of = ahead if isinstance(ahead, dict) else {}
    start = start_plan(settings) if ahead_of else "no enroot create ahead"
    start_of = start if isinstance(start, dict) else {}
    lines = [
        "/* generated by tether.container.rank_launcher at install; do not edit */",
        f"#define TR_PYTHON_LAUNCHER {c_string(python_launcher)}",
        f"#define TR_CONFIG_PATH {c_string(config_path or '/nonexistent')}",
        f"#define TR_HAS_IDENTITY {int(identity is not None)}",
        f"#define TR_CONFIG_INO {identity[0] if identity else 0}ULL",
        f"#define TR_CONFIG_SIZE {identity[1] if identity else 0}LL",
        f"#define TR_CONFIG_MTIME_NS {identity[2] if identity else 0}LL",
        f"#define TR_FAST {int(why is None)}",
        f"#define TR_WHY_NOT_FAST {c_string(why or '')}",
        f"#define TR_STORE_TEMPLATE {c_string(store)}",
        f"#define TR_USER_RUN_ROOT {c_string(layout.USER_RUN_ROOT)}",
        f"#define TR_RUNTIME_ENV_COUNT {len(runtime_env)}",
        f"#define TR_RUNTIME_ENV_HAS_TMPDIR {int('TMPDIR' in runtime_env)}",
        f"#define TR_ENV_INHERIT {int(mode == 'inherit')}",
        f"#define TR_MAX_TEXT {MAX_TEXT}",
        f"#define TR_GRACE_MS {round(grace * 1000)}",
        # the run side's names (the rank environment's, the launcher protocol's), as in tether_names.h
        *(f"#define {macro} {c_string(name)}" for macro, name in c_env_names()),
        f"#define TR_IMAGE_VAR {c_string(BY_NAME['container-image'].env)}",
        f"#define TR_SLOT_TYPE_VAR {c_string(BY_NAME['slot-type'].job_env)}",
        f"static const char *const TR_RUNTIME_ENV[] = {c_list([f'{k}={v}' for k, v in runtime_env.items()])};",
        f"static const char *const TR_ROOTFS_TARGETS[] = {c_list(ROOTFS_TARGETS)};",
        f"#define TR_PAUSE_PID_FILE {c_string(PAUSE_PID_FILE)}",
        f"static const char *const TR_PAUSE_NAMES[] = {c_list(PAUSE_NAMES)};",
        f"static const char *const TR_OWN_NAMES[] = {c_list(own)};",
        # Podman.launch's plan with placeholders (RankTemplate): without, with /dev/mqueue
        *(f"static const char *const TR_ARGV_{m}[] = {c_list(p['argv'])};"
          for m, p in zip(("NO_MQUEUE", "MQUEUE"), plans or [{"argv": []}] * 2)),
        *(f"#define TR_{key.upper()}_TEMPLATE {c_string(str((plans or [{}])[0].get(key, '')))}"
          for key in ("container", "created", "marker", "marker_data")),
        # the enroot create started ahead (ahead_plan)
        f"#define TR_AHEAD {int(isinstance(ahead, dict))}",
        f"#define TR_WHY_NOT_AHEAD {c_string(ahead if isinstance(ahead, str) else '')}",
        f"#define TR_AHEAD_BINARY {c_string(ahead_of.get('binary', ''))}",
        f"#define TR_AHEAD_DEFAULT {int(ahead_of.get('default', False))}",
        f"#define TR_RUNTIME_VAR {c_string(BY_NAME['container-runtime'].env)}",
        *(f"static const char *const TR_AHEAD_{key.upper()}[] = {c_list(ahead_of.get(key, []))};"
          for key in ("argv", "remove", "added", "added_without_run_dir", "runtime_env")),
        *(f"#define TR_AHEAD_{key.upper()}_TEMPLATE {c_string(ahead_of.get(key, ''))}" for key in ("name", "partial", "data", "lock")),
        f"#define TR_AHEAD_TIMEOUT_S {int(ahead_of.get('timeout', 0))}",
        f"#define TR_AHEAD_REMOVE_TIMEOUT_S {int(ahead_of.get('remove_timeout', 0))}",
        # the enroot rank run here (start_plan)
        f"#define TR_START {int(bool(start_of))}",
        f"#define TR_WHY_NOT_START {c_string(start if isinstance(start, str) else '')}",
        f"static const char *const TR_START_ARGV[] = {c_list(start_of.get('argv', []))};",
        *(f"#define TR_START_{key.upper()}_TEMPLATE {c_string(start_of.get(key, ''))}"
          for key in ("conf", "conf_cuda", "conf_path", "created", "start_lock")),
        # how long tether-run waits for the step's root before the Python launcher waits and tells
        f"#define TR_START_QUIET_MS {round(CREATE_QUIET_SECONDS * 1000 / 2)}",
        f"static const char *const TR_HOST_ONLY[] = {c_list(environment.HOST_ONLY)};",
        f"static const char *const TR_RUNTIME_CONTROL[] = {c_list(environment.RUNTIME_CONTROL)};",
        f"static const char *const TR_RUNTIME_CONTROL_NAMES[] = {c_list(environment.RUNTIME_CONTROL_NAMES)};",
        f"static const char *const TR_IMAGE_NAMES[] = {c_list(environment.IMAGE_NAMES)};",
        f"static const char *const TR_IMAGE_PREFIXES[] = {c_list(environment.IMAGE_PREFIXES)};",
        f"static const char *const TR_PASS_NAMES[] = {c_list(environment.PASS_NAMES)};",
        f"static const char *const TR_PASS_PREFIXES[] = {c_list(environment.PASS_PREFIXES)};",
    ]
    return "\n".join(lines) + "\n"


def build_rank_launcher(target: Path, config_path: str | None, settings: Mapping[str, Any],
                        python_launcher: str, *, plan_only: bool = False, bake_identity: bool = True,
                        grace: float = GRACE_SECONDS) -> Path:
    """Compile ``tether-run`` into ``target`` (mode 755, a new inode) with this configuration;
    ``plan_only``: the tests' build, which prints its plan instead of running it; ``bake_identity``,
    ``grace``: see ``baked_header``."""
    with tempfile.TemporaryDirectory(prefix="tether-run-build-") as tmp:
        (Path(tmp) / BAKED_HEADER).write_text(baked_header(config_path, settings, python_launcher,
                                                           bake_identity=bake_identity, grace=grace))
        cbuild = CBuild(Path(tmp))
        objects = [cbuild.compile(RANK_LAUNCHER_SOURCE, include_dirs=[tmp], header_dirs=[Path(tmp)],
                                  defines=["-DTETHER_RUN_PLAN_ONLY"] if plan_only else [])]
        return cbuild.link(objects, Path(target))


def build_fd_helper(target: Path) -> Path:
    """Compile ``tether-fd-receive`` (runtimes.enroot.FD_HELPER: PMI_FD into an enroot container)
    into ``target``, static: it runs inside any image, whatever C library the image has."""
    with tempfile.TemporaryDirectory(prefix="tether-fd-receive-build-") as tmp:
        cbuild = CBuild(Path(tmp))
        return cbuild.link([cbuild.compile(FD_HELPER_SOURCE)], Path(target), link_args=["-static-pie"])

"""The C rank launcher (container/tether_run.c): its plan is Podman.launch's, argument for argument,
for every rank environment it takes; everything else goes to the Python launcher, with the reason;
its run ends as podman did, leaves nothing behind, and hands an unclean end over to be concluded.

Built here as the tests' variant (``plan_only``: the plan printed instead of run) and as the real
one; run as an unprivileged user (nobody when the tests run as root), as slurmstepd runs tasks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tether.container.launch import GRACE_SECONDS, parse_resume
from tether.container.rank_launcher import (PLACEHOLDERS, RANK_LAUNCHER_SOURCE, RankTemplate, baked_header,
                                           build_rank_launcher, c_string, why_not_fast)
from helpers import alive

NOBODY = 65534
UID = NOBODY if os.getuid() == 0 else os.getuid()

REFERENCE = textwrap.dedent("""\
    # the Python launcher's plan for this rank, printed as the C launcher's plan-only build prints it
    import json, os, sys
    from tether.container.run import task_command, ARGV0_VAR, SUBREAPER_VAR, RESUME_VAR
    from tether.container.runtimes import adapter
    from tether.container.spec import spec_from_env
    settings = json.loads(sys.argv[1])
    env = dict(os.environ)
    argv0 = env.pop(ARGV0_VAR, None)
    env.pop(RESUME_VAR, None)
    env.pop(SUBREAPER_VAR, None)
    command = task_command(argv0, ["tether-run", *sys.argv[2:]])
    spec = spec_from_env(env, command, default_runtime=settings["runtime"], defaults=settings)
    runtime = adapter("podman", settings["podman"], environment=settings.get("environment") or "inherit")
    launch = runtime.launch(spec, env)
    assert not launch.before and launch.prepare is None and launch.supervise and not launch.after
    names = ""
    for fd in (launch.fds or {}):
        os.lseek(fd, 0, 0)
        names = os.read(fd, 1 << 16).decode()
    out = {"argv": launch.argv, "env": launch.env, "names": names, "marker": launch.marker,
           "marker_data": launch.marker_data, "created": launch.created}
    print(json.dumps(out))
""")


def _as(uid):
    if os.getuid() == 0:
        return lambda: (os.setgid(uid), os.setuid(uid))
    return None


@pytest.fixture(scope="module")
def world():
    """A rank's world: a store and run base anyone may make theirs, a rank directory and a rootfs
    of the user's, a complete shared (root-owned where possible) rootfs, a config file."""
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="tether-rank-launcher-"))
    os.chmod(base, 0o1777)
    rank = base / "jobs" / "7" / "n1" / "step-0" / "rank-0"
    for d in (rank / "tmp", rank / "work"):
        d.mkdir(parents=True)
    own = base / "own-rootfs"
    (own / "bin").mkdir(parents=True)
    shared = base / "shared-rootfs"
    for target in ("etc/passwd", "etc/group", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab"):
        (shared / target).parent.mkdir(parents=True, exist_ok=True)
        (shared / target).write_text("")
    for target in ("proc", "sys", "dev", "run", "tmp", "var/tmp"):
        (shared / target).mkdir(parents=True)
    bare = base / "bare-rootfs"
    (bare / "bin").mkdir(parents=True)
    if os.getuid() == 0:
        for path in (base / "jobs", own):
            for root, dirs, files in os.walk(path):
                for name in [*dirs, *files]:
                    os.chown(os.path.join(root, name), NOBODY, NOBODY)
            os.chown(path, NOBODY, NOBODY)
    for path in (shared, bare):
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        os.chmod(path, 0o755)
    os.chmod(bare, 0o555)         # shared: nobody may write it (not even its owner, when not root)
    # the user's own directories on the node, as root makes them (a root-owned base, <uid> the
    # user's): podman's run directory (configured below: the default is /run/tether/<uid>, which
    # tests never touch) and the store's directory
    run = base / "run-dir"
    run.mkdir(mode=0o700)
    users = base / "users"
    users.mkdir(mode=0o755)
    os.chmod(users, 0o755)
    (users / str(UID)).mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(run, NOBODY, NOBODY)
        os.chown(users / str(UID), NOBODY, NOBODY)
    config = base / "tether.yaml"
    config.write_text("# the config whose identity is baked in\n")
    os.chmod(config, 0o644)
    stub = base / "tether-run-py"
    stub.write_text("#!/bin/sh\necho \"python-launcher resume=${TETHER_RUN_RESUME-unset} argv0=${TETHER_RUN_ARGV0-unset}"
                    " $*\"\nexit 42\n")
    os.chmod(stub, 0o755)
    yield {"base": base, "rank": rank, "own": own, "shared": shared, "bare": bare, "config": config, "stub": stub}
    os.chmod(bare, 0o755)
    shutil.rmtree(base, ignore_errors=True)


def settings_for(world, **podman) -> dict:
    # as root: a store whose {uid} directory root made (the default's form); else one the user makes
    store = world["base"] / ("users/{uid}/podman" if os.getuid() == 0 else "store-{uid}")
    return {"runtime": "podman", "environment": podman.pop("environment", "inherit"),
            "podman": {"args": ["--runtime", "runc"],
                       "env": {"CONTAINERS_CONF": "/etc/tether-test/containers.conf",
                               "XDG_RUNTIME_DIR": str(world["base"] / "run-dir")},
                       "store": str(store), **podman}}


# what each built launcher was built from: a test asking for the same build again reuses it (a
# build is a compile, a second or two here; most tests ask for one of a few)
_BUILT: dict[Path, tuple] = {}


def build(world, settings, name, *, plan_only=True, grace=None) -> Path:
    """The launcher built into ``world``'s NAME with these settings, baking in the config file's
    identity as it is now (inode, size, mtime); ``grace``: another than launch.py's (seconds)."""
    target = world["base"] / name
    config = os.stat(world["config"])
    made_from = (json.dumps(settings, sort_keys=True), plan_only, grace, config.st_ino, config.st_size,
                 config.st_mtime_ns)
    if _BUILT.get(target) != made_from or not target.exists():
        build_rank_launcher(target, str(world["config"]), settings, str(world["stub"]), plan_only=plan_only,
                            **({"grace": grace} if grace is not None else {}))
        _BUILT[target] = made_from
    return target


def rank_env(world, **extra) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
           "SLURM_STEPID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NNODES": "1",
           "TETHER_RANK_DIR": str(world["rank"]), "TETHER_STEP_DIR": str(world["rank"].parent),
           "TETHER_JOB_DIR": str(world["rank"].parents[2]), "TETHER_RUN_ARGV0": "true",
           "TETHER_CONTAINER_IMAGE": str(world["own"]), "TETHER_WORK_DIR": str(world["rank"] / "work"),
           "LANG": "C.UTF-8", "OMP_NUM_THREADS": "4", "MY_VAR": "a value\nwith a line", "A": "1", "A1": "2",
           "AB": "3", "LD_LIBRARY_PATH": "/x", "CONTAINERS_STORAGE_CONF": "/y", "XDG_RUNTIME_DIR": "",
           "XDG_RUNTIME_DIR_OLD": "/o", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/b", "TMPDIR": "/var/tmp/elsewhere", "PYTHONPATH": "", "TETHER_SLOT_IDS": "", "1BAD": "x"}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def plan_items(stdout: bytes) -> dict[str, list[str]]:
    """A plan-only build's output: sections of NUL-terminated items (name, count, items)."""
    items, plan = stdout.decode("utf-8", "surrogateescape").split("\0"), {}
    while len(items) > 1:
        key, count = items[0], int(items[1])
        plan[key], items = items[2:2 + count], items[2 + count:]
    return plan


def c_plan(launcher: Path, env: dict, args=()) -> dict | str:
    """The C launcher's plan, or the Python launcher's line when it handed over (and why)."""
    out = subprocess.run([str(launcher), *args], env={**env, "TETHER_RUN_WHY_PYTHON": "1"},
                         capture_output=True, stdin=subprocess.DEVNULL, preexec_fn=_as(UID), timeout=30)
    if out.stdout.startswith(b"python-launcher"):
        return out.stderr.decode().strip() + " | " + out.stdout.decode().strip()
    assert out.returncode == 0, out.stderr.decode()
    plan = plan_items(out.stdout)
    env_out = dict(e.split("=", 1) for e in plan["env"])
    return {"argv": plan["argv"], "env": env_out, "names": plan["names"][0], "marker": plan["marker"][0],
            "marker_data": json.loads(plan["marker"][1]), "created": plan["created"][0]}


def python_plan(settings: dict, env: dict, args=()) -> dict:
    out = subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(settings), *args],
                         env={**env, "TETHER_RUN_WHY_PYTHON": "1"},
                         capture_output=True, stdin=subprocess.DEVNULL, preexec_fn=_as(UID), timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr.decode()
    plan = json.loads(out.stdout)
    if "LC_CTYPE" not in env and not env.get("LANG") and not env.get("LC_ALL"):
        # Python's own start set LC_CTYPE=C.UTF-8 in a C locale (PEP 538): the Python launcher
        # passed it on; the C one passes the job's environment as it is
        del plan["env"]["LC_CTYPE"]
        plan["names"] = plan["names"].replace("LC_CTYPE\n", "")
    return plan


def normalized(plan: dict) -> dict:
    plan = dict(plan)
    plan["argv"] = ["/dev/fd/N" if a.startswith("/dev/fd/") else a for a in plan["argv"]]
    return plan


FAST_CASES = {
    "a rank's own rootfs": {},
    "a shared, complete rootfs": {"TETHER_CONTAINER_IMAGE": "shared"},
    "a login node's XDG_RUNTIME_DIR (not this node's: never used)": {"XDG_RUNTIME_DIR": "/run/user/4242"},
    "RANK over SLURM_PROCID, odd ids made safe": {"RANK": "3", "SLURM_JOB_ID": "12+3", "SLURM_STEP_ID": "4 5"},
    "Slurm 23.11's prepended launcher (empty argv0) and arguments": {"TETHER_RUN_ARGV0": "", "__args": ["sh", "-c", "x y"]},
    "a small environment": {"__bare": True},
    "CPU slots": {"TETHER_SLOT_IDS": "0,1", "TETHER_JOB_SLOT_TYPE": "cpu"},
}


@pytest.mark.parametrize("mode", ["inherit", "allowlist"])
@pytest.mark.parametrize("case", list(FAST_CASES))
def test_the_c_plan_is_the_python_plan(world, mode, case):
    settings = settings_for(world, environment=mode)
    launcher = build(world, settings, f"plan-{mode}")
    extra = dict(FAST_CASES[case])
    args = extra.pop("__args", [])
    if extra.pop("__bare", False):
        env = {k: v for k, v in rank_env(world).items() if k.startswith(("SLURM_JOB_ID", "TETHER_"))}
    else:
        env = rank_env(world)
    if extra.get("TETHER_CONTAINER_IMAGE") == "shared":
        extra["TETHER_CONTAINER_IMAGE"] = str(world["shared"])
    env.update(extra)
    if args and env.get("TETHER_RUN_ARGV0") == "":
        ours = c_plan(launcher, env, args)
        theirs = python_plan(settings, env, args)
    else:
        ours, theirs = c_plan(launcher, env, args), python_plan(settings, env, args)
    assert isinstance(ours, dict), f"went to the Python launcher: {ours}"
    assert normalized(ours) == normalized(theirs)
    assert "--rootfs" in ours["argv"] and ours["argv"][-1] == (args[-1] if args else "true")
    # podman's run directory is the node's, whatever the job's environment says
    assert ours["env"]["XDG_RUNTIME_DIR"] == str(world["base"] / "run-dir")
    assert ours["marker_data"] == {"runtime": "podman", "container": ours["argv"][ours["argv"].index("--name") + 1]}
    if mode == "inherit" and "MY_VAR" in env:
        assert "MY_VAR\n" in ours["names"] and "LD_LIBRARY_PATH" not in ours["names"]


SETTINGS_CASES = {
    "podman's default store": {"store": ""},
    "a configured TMPDIR and XDG_RUNTIME_DIR for podman": {"env": {"TMPDIR": "/var/tmp", "XDG_RUNTIME_DIR": "xdg"}},
    "another binary, no args": {"binary": "/usr/bin/podman", "args": []},
    "global options with values": {"args": ["--runtime=runc", "--cgroup-manager", "cgroupfs"]},
}


@pytest.mark.parametrize("case", list(SETTINGS_CASES))
def test_the_c_plan_is_the_python_plan_for_each_podman_setting(world, case):
    podman = dict(SETTINGS_CASES[case])
    if podman.get("env", {}).get("XDG_RUNTIME_DIR") == "xdg":
        xdg = world["base"] / "xdg-configured"
        xdg.mkdir(exist_ok=True)
        if os.getuid() == 0:
            os.chown(xdg, UID, UID)
        podman["env"] = {**podman["env"], "XDG_RUNTIME_DIR": str(xdg)}
    settings = settings_for(world, **podman)
    launcher = build(world, settings, "plan-settings")
    env = rank_env(world)
    ours, theirs = c_plan(launcher, env), python_plan(settings, env)
    assert isinstance(ours, dict), f"went to the Python launcher: {ours}"
    assert normalized(ours) == normalized(theirs)


HANDED_OVER = {
    "a mount": ({"TETHER_CONTAINER_MOUNTS": "/etc:/mnt"}, "a container option besides the image"),
    "--no-container-mount-home": ({"TETHER_NO_CONTAINER_MOUNT_HOME": "1"}, "a container option besides the image"),
    "a registry image": ({"TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}, "not a rootfs directory's plain path"),
    "an image path with a colon": ({"TETHER_CONTAINER_IMAGE": "/x:y"}, "not a rootfs directory's plain path"),
    "a missing image": ({"TETHER_CONTAINER_IMAGE": "/nonexistent/rootfs"}, "not a directory you can read"),
    "a shared rootfs without podman's mount targets": ({"TETHER_CONTAINER_IMAGE": "bare"}, "imported"),
    "GPUs": ({"TETHER_SLOT_IDS": "0"}, "GPUs"),
    "PMI-2": ({"PMI_FD": "5"}, "MPI"),
    "PMIx": ({"PMIX_SERVER_TMPDIR": "/tmp"}, "MPI"),
    "PBS": ({"PBS_JOBID": "1.server"}, "not a Slurm task"),
    "the cleanup after a step": ({"TETHER_CLEANUP": "/x"}, "not a Slurm task"),
    "a --container-batch script": ({"TETHER_RUN_BATCH": "1"}, "not a Slurm task"),
    "no rank directory": ({"TETHER_RANK_DIR": None}, "no rank directory"),
    "a rank directory with a trailing slash": ({"TETHER_RANK_DIR": "slash"}, "no rank directory"),
    "a non-ASCII id": ({"SLURM_PROCID": "\u00e9"}, "a non-ASCII id"),
    "not a child subreaper": ({"TETHER_RUN_SUBREAPER": "0"}, "subreaper"),
    "not handed a task": ({"TETHER_RUN_ARGV0": None}, "not handed a task"),
}


@pytest.mark.parametrize("case", list(HANDED_OVER))
def test_everything_else_goes_to_the_python_launcher_with_its_argv(world, case):
    launcher = build(world, settings_for(world), "plan-inherit")
    extra, why = HANDED_OVER[case]
    extra = dict(extra)
    image = extra.get("TETHER_CONTAINER_IMAGE")
    if image == "bare":
        extra["TETHER_CONTAINER_IMAGE"] = str(world["bare"])
    if extra.get("TETHER_RANK_DIR") == "slash":
        extra["TETHER_RANK_DIR"] = str(world["rank"]) + "/"
    env = rank_env(world, **extra)
    said = c_plan(launcher, env, ["an", "argument"])
    assert isinstance(said, str) and why in said, said
    # (podman's default runtime: no enroot rank here, no create ahead)
    said = re.sub(r"^(tether-run: no enroot (run here|create ahead): [^\n]*\n)+", "", said)
    assert said.startswith("tether-run: python: ") and said.endswith(" an argument")   # the same argv
    assert "resume=unset" in said


def test_a_configuration_the_c_path_cannot_take_or_that_changed_goes_to_python(world):
    assert why_not_fast({"runtime": "podman", "mounts": ["/a:/b"]}) == "container.mounts is set"
    assert why_not_fast({"runtime": "enroot"}) == "the default runtime is enroot"
    launcher = build(world, {**settings_for(world), "runtime": "enroot"}, "plan-enroot")
    assert "the default runtime is enroot" in c_plan(launcher, rank_env(world))
    launcher = build(world, settings_for(world), "plan-changed")
    assert isinstance(c_plan(launcher, rank_env(world)), dict)
    config = world["config"]
    text = config.read_text()
    config.write_text(text + "# changed\n")
    try:
        said = c_plan(launcher, rank_env(world))
        assert isinstance(said, str) and "configuration changed" in said
    finally:
        config.write_text(text)


def test_the_c_launcher_spells_no_podman_argument_of_its_own():
    """podman's arguments, the container's name, its id file and the cleanup marker are baked from
    Podman.launch (RankTemplate): tether_run.c writes none of them itself, so a change to the
    Python launcher's plan changes the C one's at the next install."""
    source = RANK_LAUNCHER_SOURCE.read_text()
    code = re.sub(r"/\*.*?\*/", "", source, flags=re.S)          # what it says in comments may name them
    assert not re.findall(r'"--[a-z]', code)
    assert not re.findall(r'"(?:run"|tether-%|tether\.job|%s/\.cid|/dev/fd/)', code)
    assert "TR_CLEANUP_MARKER" not in code and "TR_PODMAN_ARGS" not in code


def test_every_placeholder_of_the_templates_is_one_the_c_launcher_fills_in():
    source = RANK_LAUNCHER_SOURCE.read_text()
    filled = set(re.findall(r"values\['([A-Z])'\] = ", source))
    for mqueue in (False, True):
        plan = RankTemplate.plan({"runtime": "podman", "podman": {}}, mqueue=mqueue)
        used = {m for text in (*plan["argv"], plan["container"], plan["created"], plan["marker"],
                               plan["marker_data"]) for m in re.findall("\x01(.)", text)}
        assert used - {"C"} <= filled and used >= {"J", "S", "K", "D", "B", "I", "T", "U", "F", "C"}
        assert plan["argv"].count(PLACEHOLDERS["COMMAND"]) == 1 and plan["argv"][-1] == PLACEHOLDERS["COMMAND"]
    assert "--ipc=host" in RankTemplate.plan({"podman": {}}, mqueue=True)["argv"]
    assert "--ipc=host" not in RankTemplate.plan({"podman": {}}, mqueue=False)["argv"]


def test_root_goes_to_python(world):
    launcher = build(world, settings_for(world), "plan-inherit")
    # uid 0 in a user namespace of its own (unshare -r), whoever runs the tests
    out = subprocess.run(["unshare", "-r", str(launcher)], env={**rank_env(world), "TETHER_RUN_WHY_PYTHON": "1"},
                         capture_output=True, timeout=30)
    assert b"python: root" in out.stderr and out.stdout.startswith(b"python-launcher")


def test_baked_strings_are_c_literals():
    assert c_string('a"b\\c\n\u00e9?') == '"a\\"b\\\\c\\012\\303\\251\\?"'
    header = baked_header(None, {"runtime": "podman", "podman": {"args": ["--x=\"1\""]}}, "/p")
    # podman's arguments are Podman.launch's, placeholders and all (RankTemplate)
    assert 'TR_ARGV_MQUEUE[] = {"podman", "run", "--x=\\"1\\"", ' in header and "#define TR_HAS_IDENTITY 0" in header
    assert '"--rootfs", "\\001I", "\\001C", NULL};' in header
    assert f"#define TR_GRACE_MS {round(GRACE_SECONDS * 1000)}\n" in header     # the Python launcher's grace


FAKE_PODMAN = textwrap.dedent("""\
    #!/bin/sh
    # a podman for the run: writes its --cidfile as podman does once the container exists, then
    # behaves as FAKE_MODE says; like podman, it refuses a command it does not know
    [ "$1" = run ] || { echo "Error: unrecognized command podman $1" >&2; exit 125; }
    cid=""; prev=""
    for a in "$@"; do [ "$prev" = --cidfile ] && cid="$a"; prev="$a"; done
    case "$FAKE_MODE" in
      fail-early) echo "Error: something before the container" >&2; exit 125 ;;
    esac
    [ -n "$cid" ] && echo 0123abcd > "$cid"
    echo "podman ran: $*" | tr -s ' ' | cut -c1-60 > "$FAKE_LOG"
    case "$FAKE_MODE" in
      exit3) exit 3 ;;
      pause|stale-pause)   # rootless podman's pause process (recorded in its run directory) and a
                           # monitor finishing after podman; stale-pause: the record names the monitor
        mkdir -p "$XDG_RUNTIME_DIR/libpod/tmp"
        ( setsid catatonit 600 </dev/null >/dev/null 2>&1 & echo $! > "$FAKE_LOG.pause" )
        ( conmon 1 </dev/null >/dev/null 2>&1 & echo $! > "$FAKE_LOG.monitor" )
        [ "$FAKE_MODE" = pause ] && cp "$FAKE_LOG.pause" "$XDG_RUNTIME_DIR/libpod/tmp/pause.pid"
        [ "$FAKE_MODE" = stale-pause ] && cp "$FAKE_LOG.monitor" "$XDG_RUNTIME_DIR/libpod/tmp/pause.pid"
        exit 0 ;;
      lost-race)   # a podman that lost the race to make the pause process kills its own (forked,
                   # still named podman), which is the launcher's once its parent exits
        python3 -c "$LOST_RACE"
        sleep 0.2    # podman goes on: the launcher reaps the killed one first
        exit 0 ;;
      sleep) trap 'echo term >> "$FAKE_LOG"; exit 143' TERM; sleep 30 & wait; exit 0 ;;
    esac
    exit 0
""")


# a pause process forked (named podman, as podman forks it from itself) and killed by its parent,
# which exits without reaping it
LOST_RACE = textwrap.dedent("""\
    import ctypes, os, time
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(15, b"podman", 0, 0, 0)     # PR_SET_NAME
        os.write(w, b"x")
        time.sleep(600)
    os.read(r, 1)
    os.kill(pid, 9)
    os._exit(0)
    """)


@pytest.fixture()
def runnable(world):
    bin_dir = world["base"] / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "podman").write_text(FAKE_PODMAN)
    os.chmod(bin_dir / "podman", 0o755)
    for name in ("catatonit", "conmon"):          # processes with those command names
        # renamed into place: an earlier test's one may still run (copying over it: "Text file busy")
        shutil.copy("/bin/sleep", bin_dir / f".{name}.new")
        os.chmod(bin_dir / f".{name}.new", 0o755)
        os.replace(bin_dir / f".{name}.new", bin_dir / name)
    launcher = build(world, settings_for(world), "run", plan_only=False)
    log = world["base"] / "fake.log"

    def start(mode: str, *, grace=None, **kw):
        """The launcher run as a rank with the fake podman in ``mode``; ``grace``: one built with
        that grace (seconds) instead of launch.py's."""
        if log.exists():
            log.unlink()
        env = rank_env(world, PATH=f"{bin_dir}:/usr/bin:/bin", FAKE_MODE=mode, FAKE_LOG=str(log), **kw.pop("env", {}))
        if os.getuid() == 0:
            log.touch()
            os.chown(log, UID, UID)
        run = launcher if grace is None else build(world, settings_for(world), f"run-grace-{grace}",
                                                   plan_only=False, grace=grace)
        return subprocess.Popen([str(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_as(UID), **kw)
    return start, log


def test_a_clean_run_ends_as_podman_did_and_leaves_nothing(world, runnable):
    start, log = runnable
    for mode, code in (("ok", 0), ("exit3", 3)):
        proc = start(mode)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err
        assert b"python-launcher" not in out                     # concluded here
        assert log.read_text().startswith("podman ran: run --runtime runc --root")
        assert not (world["rank"] / ".cid").exists()
        assert not (world["rank"].parent / ".cleanup-0").exists()


@pytest.mark.parametrize("mode", ["pause", "stale-pause"])
def test_the_launcher_never_waits_for_podmans_pause_process(world, runnable, mode):
    """Issue 46, 6: the C launcher too waited its whole grace (5 s) for rootless podman's pause
    process, which podman's first command of a user on a cold node starts and which becomes the
    launcher's child. It still waits for the monitor finishing (conmon), but not for the process
    podman recorded as its pause process, which it ends itself, as the step's end would; a record
    naming another process (stale: its pid reused) makes nothing the runtime's own, and that
    process is waited for. (A launcher with a 2 s grace: the monitor ends after 1 s, and the stale
    case waits the grace out.)"""
    start, log = runnable
    pause = Path(f"{log}.pause")
    try:
        proc = start(mode, grace=2, env={"TETHER_RUN_TELL_REAPING": "1"})
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert b"python-launcher" not in out                     # concluded here
        pause_pid, monitor = int(pause.read_text()), int(Path(f"{log}.monitor").read_text())
        if mode == "pause":
            said = f"launcher=c reaped=1 runtime_own={pause_pid} ended=1 grace_ran_out=0"
            assert not alive(pause_pid)              # not waited for, but ended (end_runtime_own)
        else:
            said = "launcher=c reaped=1 runtime_own=none ended=0 grace_ran_out=1"
        assert f"tether-run: after the runtime: {said}\n" in err.decode()
        assert not alive(monitor)                    # waited for, and reaped
    finally:
        if pause.exists() and alive(int(pause.read_text())):
            os.kill(int(pause.read_text()), signal.SIGKILL)
        shutil.rmtree(world["base"] / "run-dir" / "libpod", ignore_errors=True)
        for leftover in (pause, Path(f"{log}.monitor")):
            leftover.unlink(missing_ok=True)


def test_a_pause_process_its_podman_killed_is_no_unclean_end(world, runnable):
    """Issue 46, 6: on a cold node the ranks' podmans race to make the pause process; the losers kill
    theirs, which a child subreaper reaps. That is podman's own business, not a process of the
    rank killed: the C launcher concludes the run itself (it handed such runs to Python)."""
    start, log = runnable
    proc = start("lost-race", env={"TETHER_RUN_TELL_REAPING": "1", "LOST_RACE": LOST_RACE})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b"python-launcher" not in out, out                    # concluded here
    assert b"tether-run: after the runtime: launcher=c reaped=0 runtime_own=none ended=0 grace_ran_out=0\n" in err


def test_an_unclean_end_is_handed_over_with_what_happened(world, runnable):
    start, log = runnable
    proc = start("fail-early")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42 and b"Error: something before the container" in err
    said = out.decode()
    assert f"resume={125 << 8};0;;0;0;podman" in said and "argv0=true" in said     # no id file, nothing changed
    assert parse_resume(f"{125 << 8};0;;0;0;podman") == (125 << 8, False, [], [], "podman")
    # the marker stays for the Python launcher's conclusion (it removes it once the container is gone)
    assert json.loads((world["rank"].parent / ".cleanup-0").read_text()) == {"runtime": "podman",
                                                                             "container": "tether-7-0-0"}

    proc = start("sleep")
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)                    # forwarded to podman (no Slurm cgroup here)
    out, err = proc.communicate(timeout=30)
    assert "term" in log.read_text()
    assert proc.returncode == 42 and f"resume={143 << 8};1;15;0;" in out.decode() and ";podman" in out.decode()


def test_the_handover_is_parsed_strictly():
    assert parse_resume(f"{9};-1;15,2;9;1;podman") == (9, None, [15, 2], [("conmon", 9), ("", signal.SIGKILL)],
                                                       "podman")
    assert parse_resume("256;0;;0;0;enroot") == (256, False, [], [], "enroot")
    for bad in ("", "1;2;;0;0;podman", "x;0;;0;0;podman", "1;0;a;0;0;podman", "1;0;;-1;0;podman", "1;0;;0;podman",
                # what int() takes but C's %d never prints (issue 39: "strict" was not)
                "1_0;0;;0;0;podman", " 1;0;;0;0;podman", "+1;0;;0;0;podman", "\u0661;0;;0;0;podman",
                "1;0;1_5;0;0;podman", "1;0;15,;0;0;podman", "1;0; 15;0;0;podman", "1;0;;0;0;podman\n",
                "99999999999;0;;0;0;podman", "65536;0;;0;0;podman", "1;0;65;0;0;podman", "1;0;;65;0;podman",
                # the runtime it ran: one the C launcher runs, named as it names it
                "1;0;;0;0", "1;0;;0;0;", "1;0;;0;0;apptainer", "1;0;;0;0;Podman", "1;0;;0;0;podman;x"):
        assert parse_resume(bad) is None, bad


def test_the_baked_identity_is_read_back_for_tether_doctor(tmp_path):
    from tether.container.run import baked_identity, config_identity, launcher_text

    config = tmp_path / "tether.yaml"
    config.write_text("job_storage_root: /x\n")
    launcher = tmp_path / "tether-run-py"
    launcher.write_text(launcher_text(str(config), {"runtime": "podman"}))
    assert baked_identity(launcher) == (str(config), config_identity(str(config)))
    config.write_text("job_storage_root: /y/changed\n")
    assert baked_identity(launcher)[1] != config_identity(str(config))    # doctor warns: ranks take Python
    launcher.write_text("not a launcher\n")
    assert baked_identity(launcher) is None and baked_identity(tmp_path / "missing") is None


# ---- the enroot create started ahead (rank_launcher.ahead_plan, tether_run.c: create_ahead) ----

AHEAD_REFERENCE = textwrap.dedent("""\
    # the Python launcher's enroot create for this rank, as the C launcher's plan-only build prints it
    import json, os, sys
    from tether.container.run import ARGV0_VAR, RESUME_VAR, SUBREAPER_VAR, runtime_for
    from tether.container.spec import spec_from_env
    import tether.hooks.layout
    settings = json.loads(sys.argv[1])
    tether.hooks.layout.USER_RUN_ROOT = sys.argv[2]      # the test's, never /run/tether
    env = dict(os.environ)
    for name in (ARGV0_VAR, RESUME_VAR, SUBREAPER_VAR):
        env.pop(name, None)
    spec = spec_from_env(env, ["true"], default_runtime=settings["runtime"], defaults=settings)
    launch = runtime_for(spec.runtime, settings).launch(spec, env)
    create, check = launch.before[0][0], launch.before[0][1]
    partial = create.partial("PID")
    print(json.dumps({"argv": create.argv(partial), "remove": create.remove_argv(partial), "env": launch.env,
                      "paths": [create.name, create.data, launch.lock], "check": check}))
""")


def enroot_settings(world, **enroot) -> dict:
    from tether.hooks.configfile import load_config

    bin_dir = world["base"] / "enroot-bin"
    bin_dir.mkdir(exist_ok=True)
    binary = bin_dir / "enroot"
    if not binary.exists():
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(0o755)
        (world["base"] / "enroot-links").mkdir()
        (world["base"] / "enroot-links/enroot").symlink_to(binary)
    settings = dict(load_config(None).data["container"])
    settings.update(runtime="enroot", environment="inherit",
                    enroot={"binary": str(binary), "args": [], "env": {"ENROOT_SQUASH_OPTIONS": "-comp lzo"},
                            "store": "", **enroot})
    return json.loads(json.dumps(settings))


def ahead_env(world, **extra) -> dict:
    image = world["base"] / "img.sqsh"
    if not image.exists():
        image.write_bytes(b"hsqs" + bytes(4092))
        image.chmod(0o644)
    return rank_env(world, **{"TETHER_CONTAINER_IMAGE": str(image), **extra})


def c_ahead(launcher: Path, env: dict) -> dict | str:
    """The C launcher's enroot create ahead (its plan-only build), or why it started none."""
    out = subprocess.run([str(launcher)], env={**env, "TETHER_RUN_WHY_PYTHON": "1"}, capture_output=True,
                         stdin=subprocess.DEVNULL, preexec_fn=_as(UID), timeout=30)
    if out.stdout.startswith(b"python-launcher"):
        return out.stderr.decode().strip()
    assert out.returncode == 0, out.stderr.decode()
    plan = plan_items(out.stdout)
    return {"argv": plan["argv"], "remove": plan["remove"], "env": dict(e.split("=", 1) for e in plan["env"]),
            "paths": plan["paths"]}


def run_reference(script: str, settings: dict, env: dict, *args: str) -> dict:
    """A reference script's plan of the Python launcher for this rank (as the user, from /)."""
    out = subprocess.run([sys.executable, "-c", script, json.dumps(settings), *args],
                         env={**env, "TETHER_RUN_WHY_PYTHON": "1"}, capture_output=True, stdin=subprocess.DEVNULL,
                         preexec_fn=_as(UID), timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr.decode()
    plan = json.loads(out.stdout)
    if "LC_CTYPE" not in env and not env.get("LANG") and not env.get("LC_ALL"):
        del plan["env"]["LC_CTYPE"]         # Python's own C-locale coercion (PEP 538), as above
        if "conf" in plan:
            plan["conf"] = plan["conf"].replace("printf '%s\\n' 'LC_CTYPE=C.UTF-8'\n", "")
    return plan


def python_ahead(settings: dict, env: dict, user_run_root: Path) -> dict:
    plan = run_reference(AHEAD_REFERENCE, settings, env, str(user_run_root))
    assert plan.pop("check") == os.path.join(plan["paths"][1], plan["paths"][0])     # done when the root is there
    return plan


AHEAD_CASES = {
    "a plain rank": {},
    "the binary's directory later on PATH": {"PATH": "/usr/bin:BIN:/bin"},
    "an empty PATH component": {"PATH": "/usr/bin::/bin"},
    "an empty PATH": {"PATH": ""},
    "no PATH": {"PATH": None},
    "RANK over SLURM_PROCID, odd ids made safe": {"RANK": "3", "SLURM_JOB_ID": "12+3", "SLURM_STEP_ID": "4 5"},
    "a job variable the configuration replaces, a terminal's and MPI's": {"ENROOT_SQUASH_OPTIONS": "-comp xz",
                                                                          "PMI_FD": "9", "TERM": "xterm"},
    "a small environment": {"__bare": True},
    "--container-runtime=enroot, where it is not the default": {"__podman": True, "TETHER_CONTAINER_RUNTIME": "enroot"},
}


@pytest.fixture
def user_run_root(world, monkeypatch, request):
    """hooks.layout.USER_RUN_ROOT in the world (baked into the launchers built meanwhile): with the
    user's run directory in it (as the SPANK plugin makes it), or without."""
    from tether.hooks import layout

    root = world["base"] / "user-run"
    (root / str(UID)).mkdir(parents=True, exist_ok=True)
    os.chmod(root / str(UID), 0o700)
    if os.getuid() == 0:
        os.chown(root / str(UID), UID, UID)
    chosen = root if getattr(request, "param", "the user's") == "the user's" else world["base"] / "no-user-run"
    monkeypatch.setattr(layout, "USER_RUN_ROOT", str(chosen))
    return chosen


@pytest.mark.parametrize("case", list(AHEAD_CASES))
@pytest.mark.parametrize("binary", ["absolute", "a link", "a bare name", "a doubled slash"])
@pytest.mark.parametrize("user_run_root", ["the user's", "none"], indirect=True)
def test_the_enroot_create_started_ahead_is_the_python_launchers(world, case, binary, user_run_root):
    """The enroot create that tether-run starts before handing the rank to Python is, argument for
    argument and variable for variable, the one the Python launcher's Enroot.launch plans: the
    same command and environment (enroot's own PATH first included), the same root, lock and
    partial name."""
    enroot = {"absolute": {}, "a link": {"binary": str(world["base"] / "enroot-links/enroot")},
              "a bare name": {"binary": "enroot"},
              "a doubled slash": {"binary": f"{world['base']}/enroot-bin//enroot"}}[binary]
    extra = dict(AHEAD_CASES[case])
    settings = enroot_settings(world, **enroot)
    if extra.pop("__podman", False):
        settings["runtime"] = "podman"
    launcher = build(world, settings, f"ahead-{binary.replace(' ', '-')}-{settings['runtime']}-{user_run_root.name}")
    env = ahead_env(world)
    if extra.pop("__bare", False):
        env = {k: v for k, v in env.items() if k.startswith(("SLURM_JOB_ID", "TETHER_"))}
    env.update({k: v.replace("BIN", str(world["base"] / "enroot-bin")) if v else v for k, v in extra.items()})
    env = {k: v for k, v in env.items() if v is not None}
    ours, theirs = c_ahead(launcher, env), python_ahead(settings, env, user_run_root)
    assert isinstance(ours, dict), f"no create ahead: {ours}"
    assert ours == theirs
    # enroot's runtime path: the user's run directory, shallow (Enroot.runtime_path), or the step's
    assert ours["env"]["ENROOT_RUNTIME_PATH"] == (f"{user_run_root}/{UID}/enroot" if user_run_root.name == "user-run"
                                                  else f"{world['rank'].parent}/enroot/run")
    assert ours["argv"][1:3] == ["create", "--name"] and ours["argv"][-1] == env["TETHER_CONTAINER_IMAGE"]
    assert ours["env"]["ENROOT_DATA_PATH"] == ours["paths"][1]
    if binary != "a bare name":
        assert str(world["base"] / "enroot-bin") in ours["env"]["PATH"].split(":")[:2]


AHEAD_REFUSED = {
    "another container option": ({"TETHER_CONTAINER_MOUNTS": "/a:/b"}, "a container option besides the image"),
    "the job sets enroot's data path": ({"ENROOT_DATA_PATH": "/x"}, "sets one of enroot's paths"),
    "an image directory": ({"TETHER_CONTAINER_IMAGE": "own"}, "not a file you can read"),
    "a registry image": ({"TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}, "not a squashfs file's plain path"),
    "a missing image": ({"TETHER_CONTAINER_IMAGE": "/nonexistent.sqsh"}, "not a file you can read"),
    "a rank directory of someone else's step": ({"TETHER_RANK_DIR": "/tmp/rank-0"}, "the step directory is not yours"),
    "no Slurm task": ({"SLURM_JOB_ID": None}, "not a Slurm task"),
}


@pytest.mark.parametrize("case", list(AHEAD_REFUSED))
def test_a_rank_the_create_ahead_does_not_fit_goes_to_python_alone(world, case):
    launcher = build(world, enroot_settings(world), "ahead-absolute")
    extra, why = AHEAD_REFUSED[case]
    extra = {k: str(world["own"]) if v == "own" else v for k, v in extra.items()}
    env = {k: v for k, v in ahead_env(world, **extra).items() if v is not None}
    said = c_ahead(launcher, env)
    assert isinstance(said, str) and f"tether-run: no enroot create ahead: " in said and why in said, said


def test_a_configuration_without_the_create_ahead_says_why(world):
    from tether.container.rank_launcher import ahead_plan

    assert ahead_plan(settings_for(world))["default"] is False
    # enroot's paths set by the admin: the step's root is no longer the shared one Python makes
    assert "a container root of its own" in ahead_plan(enroot_settings(world, env={"ENROOT_DATA_PATH": "/x"}))
    launcher = build(world, settings_for(world), "plan-inherit")
    said = c_plan(launcher, rank_env(world, TETHER_CONTAINER_MOUNTS="/a:/b"))
    assert "no enroot create ahead: a container option besides the image" in said
    said = c_ahead(launcher, ahead_env(world))
    assert "no enroot create ahead: the default runtime is not enroot" in said
    for runtime in ("podman", "Enroot", "enroot "):
        said = c_ahead(launcher, ahead_env(world, TETHER_CONTAINER_RUNTIME=runtime))
        assert "no enroot create ahead: a container option besides the image" in said
    # the root is there already (a second rank, a later look): nothing to start
    launcher = build(world, enroot_settings(world), "ahead-absolute")
    env = ahead_env(world)
    root = world["rank"].parent / "enroot" / "data" / "tether-7.0"
    root.mkdir(parents=True)
    try:
        assert "no enroot create ahead: the step's container root is there" in c_ahead(launcher, env)
    finally:
        shutil.rmtree(world["rank"].parent / "enroot")


@pytest.fixture()
def enroot_rank(world):
    """A rank of an enroot step through the real tether-run and the real Python launcher
    (run.launcher_text), the strict fake enroot (as the user: it records each call)."""
    from tether.testing.runtimes import FakeRuntimes

    fakes = FakeRuntimes(world["base"] / "fake-enroot")
    os.chmod(world["base"] / "fake-enroot", 0o755)
    settings = enroot_settings(world, binary=str(fakes.bin_dir / "enroot"), env={})
    launcher = real_launchers(world, settings, "enroot")
    step = world["rank"].parent

    def run(image: Path, *, fresh: bool = True, signal_after: float | None = None,
            **extra) -> subprocess.CompletedProcess:
        """One rank; ``fresh``: of a new step on the node (else the step's root stays);
        ``signal_after``: SIGTERM to the rank after that many seconds."""
        if fresh:
            shutil.rmtree(step / "enroot", ignore_errors=True)
        (fakes.state_dir / "calls.jsonl").unlink(missing_ok=True)
        env = ahead_env(world, **{"TETHER_CONTAINER_IMAGE": str(image), "PATH": "/usr/bin:/bin", **extra})
        env = {k: v for k, v in env.items() if v is not None}
        proc = subprocess.Popen([str(launcher)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, preexec_fn=_as(UID))
        if signal_after is not None:
            time.sleep(signal_after)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.pid, proc.returncode, out, err)      # args: the rank's pid
    yield run, fakes, step
    shutil.rmtree(step / "enroot", ignore_errors=True)


def test_the_create_ahead_makes_the_steps_root_and_the_rank_runs_in_it(world, enroot_rank):
    """tether-run's child creates the root (under its own partial name, renamed into place) while
    the Python launcher starts; the launcher waits for the lock, finds the root and starts it:
    one create per rank, by the child -- nothing left but the root."""
    run, fakes, step = enroot_rank
    ran = run(world["base"] / "img.sqsh", TETHER_RUN_WHY_PYTHON="1")
    assert ran.returncode == 0, ran.stderr
    assert "no enroot create ahead" not in ran.stderr and "python: the default runtime is enroot" in ran.stderr
    calls = [c["argv"] for c in fakes.calls("enroot")]
    assert [c[1] for c in calls] == ["create", "start"], calls
    partial = calls[0][3]
    assert re.fullmatch(r"tether-7\.0\.partial-\d+", partial)
    # made by another process than the rank's (whose pid the Python launcher's create would name)
    assert int(partial.rsplit("-", 1)[1]) != ran.args and os.listdir(step / "enroot" / "data") == ["tether-7.0"]
    assert "tether-7.0" in calls[1]
    # no line about the quick create (pyxis says nothing either)
    assert "unpacking" not in ran.stderr and "waiting" not in ran.stderr


def test_a_create_ahead_that_fails_is_made_again_by_the_python_launcher_which_says_why(world, enroot_rank):
    """A failed create ahead leaves nothing (enroot's own remove of its partial root) and says
    nothing itself: the Python launcher runs the create again and fails the rank with enroot's
    words and its own, exit 125 -- as without the create ahead."""
    run, fakes, step = enroot_rank
    bad = world["base"] / "not-squashfs.sqsh"
    bad.write_bytes(os.urandom(4096))
    bad.chmod(0o644)
    ran = run(bad)
    assert ran.returncode == 125
    assert f"failed to unpack the container root of {bad} (enroot create)" in ran.stderr
    assert ran.stderr.count("Invalid image format") == 1, ran.stderr
    calls = [c["argv"] for c in fakes.calls("enroot")]
    assert [c[1] for c in calls] == ["create", "remove", "create", "remove"]
    assert calls[0][3] == calls[1][3] != calls[2][3] == calls[3][3] == f"tether-7.0.partial-{ran.args}"
    assert os.listdir(step / "enroot" / "data") == []


SLOW_ENROOT = textwrap.dedent("""\
    #!/bin/sh
    # enroot for the create-ahead tests: its call and its parent's descriptors in $AHEAD_LOG; a
    # create that takes $AHEAD_SLEEP seconds
    echo "$$ $1 $(ls /proc/$PPID/fd | sort -n | tr '\\n' ' ')" >> "$AHEAD_LOG"
    if [ "$1" = create ] && [ -n "$AHEAD_SLEEP" ]; then exec sleep "$AHEAD_SLEEP"; fi
    exit 0
    """)


def real_launchers(world, settings: dict, name: str) -> Path:
    """tether-run and the Python launcher it hands over to, both as installed, for ``settings``
    (no config file: the baked settings are the ones); tether-run's path."""
    from tether.container.run import launcher_text

    python_launcher = world["base"] / f"tether-run-py-{name}"
    python_launcher.write_text(launcher_text(None, settings))
    python_launcher.chmod(0o755)
    launcher = world["base"] / f"tether-run-{name}"
    build_rank_launcher(launcher, None, settings, str(python_launcher))
    return launcher


def logged_enroot(world, name: str, script: str) -> tuple[dict, Path, Path]:
    """An enroot of ``script`` (SLOW_ENROOT's kind: it logs its calls) in the settings; (settings,
    its empty log, the step directory without enroot's directories)."""
    enroot = world["base"] / name
    enroot.write_text(script)
    enroot.chmod(0o755)
    log = world["base"] / f"{name}.log"
    log.write_text("")
    log.chmod(0o666)
    step = world["rank"].parent
    shutil.rmtree(step / "enroot", ignore_errors=True)
    return enroot_settings(world, binary=str(enroot), env={}), log, step


def test_a_create_ahead_holds_nothing_of_the_tasks_and_ends_with_the_rank(world):
    """The child that runs the create keeps only the lock (no PMI_FD, none of the task's output:
    the rank's end waits for no reader), and a rank whose Python launcher ends at once (a bad
    option, say) ends the create with it -- not after the whole unpacking, under the lock."""
    import fcntl

    settings, log, step = logged_enroot(world, "slow-enroot", SLOW_ENROOT)
    gone = world["base"] / "python-launcher-gone"
    # a launcher that fails the rank once the create has started (it says so in the log)
    gone.write_text("#!/bin/sh\necho python-launcher ahead=$TETHER_RUN_AHEAD\n"
                    "for i in $(seq 200); do [ -s \"$AHEAD_LOG\" ] && break; sleep 0.05; done\nexit 125\n")
    gone.chmod(0o755)
    launcher = world["base"] / "tether-run-ahead-ends"
    build_rank_launcher(launcher, None, settings, str(gone))
    r, w = os.pipe()                  # a descriptor of the task's, as PMI_FD is
    try:
        started = time.monotonic()
        ran = subprocess.run([str(launcher)], env=ahead_env(world, AHEAD_LOG=str(log), AHEAD_SLEEP="60"),
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, preexec_fn=_as(UID),
                             pass_fds=(w,), timeout=60)
        assert ran.stdout == "python-launcher ahead=1\n" and ran.returncode == 125
        assert time.monotonic() - started < 30                 # nobody kept the output open
        deadline = time.monotonic() + 20
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid, command, *fds = log.read_text().split()
        assert command == "create" and str(w) not in fds and len(fds) == 4, fds    # 0, 1, 2 and the lock
        while alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(int(pid)), "the create outlived its rank"
        with open(step / "enroot" / ".lock", "a") as lock:      # and the lock is free
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert [line.split()[1] for line in log.read_text().splitlines()] == ["create"]   # no remove run
    finally:
        os.close(r)
        os.close(w)
        shutil.rmtree(step / "enroot", ignore_errors=True)


# ---- the enroot rank run by tether-run itself (rank_launcher.start_plan, tether_run.c: enroot_plan) ----

START_REFERENCE = textwrap.dedent("""\
    # the Python launcher's enroot start for this rank, as the C launcher's plan-only build prints it
    import json, os, sys
    from tether.container.run import ARGV0_VAR, RESUME_VAR, SUBREAPER_VAR, runtime_for, task_command
    from tether.container.spec import spec_from_env
    import tether.hooks.layout
    settings = json.loads(sys.argv[1])
    tether.hooks.layout.USER_RUN_ROOT = sys.argv[2]      # the test's, never /run/tether
    env = dict(os.environ)
    argv0 = env.pop(ARGV0_VAR, None)
    for name in (RESUME_VAR, SUBREAPER_VAR):
        env.pop(name, None)
    command = task_command(argv0, ["tether-run", *sys.argv[3:]])
    spec = spec_from_env(env, command, default_runtime=settings["runtime"], defaults=settings)
    launch = runtime_for(spec.runtime, settings).launch(spec, env)
    create, turn = launch.before[0][0], launch.before[1][0]
    argv = launch.argv
    conf = argv[argv.index("--conf") + 1]
    print(json.dumps({"argv": argv, "env": launch.env, "conf": open(conf).read(),
                      "paths": [conf, launch.created, turn.lock, launch.lock,
                                os.path.join(create.data, create.name)],
                      "started": turn.started}))
""")


def c_start(launcher: Path, env: dict, args=()) -> dict | str:
    """The C launcher's enroot rank (its plan-only build), or why it runs none here."""
    out = subprocess.run([str(launcher), *args], env={**env, "TETHER_RUN_WHY_PYTHON": "1"}, capture_output=True,
                         stdin=subprocess.DEVNULL, preexec_fn=_as(UID), timeout=30)
    if out.stdout.startswith(b"python-launcher"):
        return out.stderr.decode().strip()
    assert out.returncode == 0, out.stderr.decode()
    plan = plan_items(out.stdout)
    if "start-argv" not in plan:          # the create ahead's plan alone: the rank goes to Python
        return out.stderr.decode().strip()
    return {"argv": plan["start-argv"], "env": dict(e.split("=", 1) for e in plan["start-env"]),
            "conf": plan["conf"][0], "paths": plan["start-paths"]}


def python_start(settings: dict, env: dict, user_run_root: Path, args=()) -> dict:
    plan = run_reference(START_REFERENCE, settings, env, str(user_run_root), *args)
    assert plan.pop("started") == plan["paths"][1]      # the start turn ends when the command runs
    return plan


def start_env(world, **extra) -> dict:
    """An enroot rank's environment, of values enroot's environment file carries."""
    return {k: v for k, v in ahead_env(world, **{"MY_VAR": "a value with spaces", **extra}).items() if v is not None}


START_CASES = {
    "a plain rank": {},
    "Slurm 23.11's prepended launcher (empty argv0) and arguments": {"TETHER_RUN_ARGV0": "", "__args": ["sh", "-c", "x y"]},
    "values with quotes, blanks, '=', '$' and non-ASCII bytes": {
        "Q1": "it's", "Q2": '"open', "Q3": "'a' and 'b", "Q4": "  lead and trail \t", "Q5": "a=b=c", "Q6": "$HOME `x`",
        "Q7": "caf\udcc3\udca9", "EMPTY": "", "Z_LAST": "z", "_UNDER": "u"},
    "names the image keeps, the runtime's control variables and host paths": {
        "PATH": "/usr/bin:/bin", "LD_PRELOAD": "/x.so", "ENROOT_MOUNT_HOME": "y", "TETHER_STEP_DIR": "/x"},
    "RANK over SLURM_PROCID, odd ids made safe": {"RANK": "3", "SLURM_JOB_ID": "12+3", "SLURM_STEP_ID": "4 5"},
    "CUDA GPUs": {"TETHER_SLOT_IDS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"},
    "CPU slots": {"TETHER_SLOT_IDS": "0,1", "TETHER_JOB_SLOT_TYPE": "cpu"},
    "an empty slot list": {"TETHER_SLOT_IDS": ","},
    "PMIx (srun --mpi=pmix)": {"PMIX_SERVER_TMPDIR": "/var/tmp", "PMIX_RANK": "0"},
    "names of 300 characters (no name is too long to pass)": {"L" * 300: "v", "SLURM_" + "X" * 300: "w",
                                                             "LD_" + "Y" * 300: "z", "ENROOT_" + "Z" * 300: "q"},
    "a small environment": {"__bare": True},
    "--container-runtime=enroot, where it is not the default": {"__podman": True, "TETHER_CONTAINER_RUNTIME": "enroot"},
}


@pytest.mark.parametrize("mode", ["inherit", "allowlist"])
@pytest.mark.parametrize("case", list(START_CASES))
@pytest.mark.parametrize("user_run_root", ["the user's", "none"], indirect=True)
def test_the_enroot_rank_run_here_is_the_python_launchers(world, mode, case, user_run_root):
    """The enroot start tether-run runs itself is, argument for argument, variable for variable and
    byte for byte of its --conf script, the one the Python launcher's Enroot.launch
    plans: the same command, environment, job's variables (sorted, as the environment contract
    passes them), tether's own values and mounts, the same root, locks and started file."""
    extra = dict(START_CASES[case])
    settings = enroot_settings(world)
    settings["environment"] = mode
    if extra.pop("__podman", False):
        settings["runtime"] = "podman"
    args = extra.pop("__args", [])
    launcher = build(world, settings, f"start-{mode}-{settings['runtime']}-{user_run_root.name}")
    env = start_env(world)
    if extra.pop("__bare", False):
        env = {k: v for k, v in env.items() if k.startswith(("SLURM_JOB_ID", "TETHER_"))}
    env.update(extra)
    env = {k: v for k, v in env.items() if v is not None}
    try:
        ours, theirs = c_start(launcher, env, args), python_start(settings, env, user_run_root, args)
    finally:
        shutil.rmtree(world["rank"].parent / "enroot", ignore_errors=True)
    assert isinstance(ours, dict), f"not run here: {ours}"
    assert ours == theirs
    command = args if env["TETHER_RUN_ARGV0"] == "" else [env["TETHER_RUN_ARGV0"], *args]
    assert ours["argv"][-len(command):] == command and ours["argv"][1] == "start"
    if "Q1" in env:
        assert ("'Q4=  lead and trail \t'\n" in ours["conf"]) == ("'Q1=it'\\''s'\n" in ours["conf"]) == (mode == "inherit")
    if "CUDA" in case:
        assert "'NVIDIA_VISIBLE_DEVICES=all'\n" in ours["conf"]


START_REFUSED = {
    "a value with a line break": ({"MY_VAR": "a\nb"}, "a value enroot's environment file cannot carry"),
    "a value in quotes": ({"MY_VAR": "'quoted' "}, "a value enroot's environment file cannot carry"),
    "a terminal's": ({"__tty": True}, "a terminal"),
    "PMI-2's descriptor": ({"PMI_FD": "9"}, "PMI_FD"),
    "a batch script": ({"TETHER_RUN_BATCH": "1"}, "not a Slurm task of a container step"),
    "ROCm GPUs": ({"TETHER_SLOT_IDS": "0", "TETHER_JOB_SLOT_TYPE": "rocm"}, "ROCm GPUs"),
    "another container option": ({"TETHER_CONTAINER_MOUNTS": "/a:/b"}, "a container option besides the image"),
    "a rank directory with a backslash": ({"TETHER_RANK_DIR": "/tmp/a\\b/rank-0"}, "no rank directory"),
    "a rank directory with a quote": ({"TETHER_RANK_DIR": "/tmp/it's/rank-0"}, "no rank directory"),
    "a registry image": ({"TETHER_CONTAINER_IMAGE": "ubuntu:22.04"}, "not a squashfs file's plain path"),
    "the job sets enroot's data path": ({"ENROOT_DATA_PATH": "/x"}, "sets one of enroot's paths"),
}


def test_a_name_twice_in_the_environment_goes_to_python(world):
    """A variable twice in the task's environment (execve allows it): getenv and Python take the
    first, bash -- enroot -- the last; such a rank is the Python launcher's."""
    launcher = build(world, enroot_settings(world), "start-inherit-enroot-user-run")
    env = [f"{k}={v}" for k, v in start_env(world, TETHER_RUN_WHY_PYTHON="1").items()]
    execve = ("import ctypes, json, sys\n"
              "env = [e.encode() for e in json.loads(sys.argv[2])]\n"
              "envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)\n"
              "argv = (ctypes.c_char_p * 2)(sys.argv[1].encode(), None)\n"
              "ctypes.CDLL(None).execve(sys.argv[1].encode(), argv, envp)\n")
    for twice in (["HOME=/first", "HOME=/second"], ["MY_VAR=one", "MY_VAR=two"]):
        out = subprocess.run([sys.executable, "-c", execve, str(launcher), json.dumps([*env, *twice])],
                             capture_output=True, stdin=subprocess.DEVNULL, preexec_fn=_as(UID), timeout=30)
        said = out.stderr.decode()
        assert "tether-run: no enroot run here: a variable twice in the environment" in said, said


def test_a_configuration_whose_enroot_rank_does_more_per_rank_runs_none_in_c(world):
    """The entrypoint's variables (set after it, by name) and the admin's mounts (their sources
    checked per rank) are the Python launcher's: no enroot rank of such a configuration runs in C."""
    from tether.container.rank_launcher import start_plan

    assert start_plan({**enroot_settings(world), "entrypoint": True}) == "container.entrypoint is set"
    assert start_plan({**enroot_settings(world), "mounts": ["/data:/data"]}) == "container.mounts is set"
    launcher = build(world, {**enroot_settings(world), "entrypoint": True}, "start-entrypoint")
    said = c_start(launcher, start_env(world))
    assert "tether-run: no enroot run here: container.entrypoint is set" in said, said


@pytest.mark.parametrize("case", list(START_REFUSED))
def test_an_enroot_rank_this_launcher_does_not_run_goes_to_python_with_the_reason(world, case):
    launcher = build(world, enroot_settings(world), "start-inherit-enroot-user-run")
    extra, why = dict(START_REFUSED[case][0]), START_REFUSED[case][1]
    tty = extra.pop("__tty", False)
    env = start_env(world, **extra)
    if tty:
        import pty

        parent, child = pty.openpty()
        try:
            out = subprocess.run([str(launcher)], env={**env, "TETHER_RUN_WHY_PYTHON": "1"}, stdin=child,
                                 capture_output=True, preexec_fn=_as(UID), timeout=30)
        finally:
            os.close(parent)
            os.close(child)
        said = out.stderr.decode()
    else:
        said = c_start(launcher, env)
    assert isinstance(said, str) and "tether-run: no enroot run here: " in said and why in said, said


def test_an_unusual_value_a_bake_cannot_place_leaves_every_rank_to_python(world):
    """start_plan says why when the configuration's launch is no plain create and start (a
    configured data path: each rank's own root), and tether-run then says it for every rank."""
    from tether.container.rank_launcher import start_plan

    assert isinstance(start_plan(enroot_settings(world)), dict)
    assert "needs more than a create and a start" in start_plan(enroot_settings(world, env={"ENROOT_DATA_PATH": "/x"})) \
        or "a container root of its own" in start_plan(enroot_settings(world, env={"ENROOT_DATA_PATH": "/x"}))


def test_the_common_enroot_rank_runs_here_from_create_to_end_without_python(world, enroot_rank):
    """A plain enroot rank (values enroot's environment file carries): tether-run creates the
    step's root (its child, under its own partial name), writes the scripts, takes the start turn,
    runs enroot start and ends with its code -- no Python launcher. A second rank of the step on
    the node starts the root the first made."""
    run, fakes, step = enroot_rank
    ran = run(world["base"] / "img.sqsh", MY_VAR="plain", TETHER_RUN_WHY_PYTHON="1")
    assert ran.returncode == 0, ran.stderr
    assert "tether-run: python" not in ran.stderr and "no enroot run here" not in ran.stderr, ran.stderr
    calls = fakes.calls("enroot")
    assert [c["argv"][1] for c in calls] == ["create", "start"]
    partial = calls[0]["argv"][3]
    assert re.fullmatch(r"tether-7\.0\.partial-\d+", partial) and int(partial.rsplit("-", 1)[1]) != ran.args
    assert os.listdir(step / "enroot" / "data") == ["tether-7.0"]
    inside, = fakes.calls("enroot-container")
    # the --conf script's environ() and mounts(), as enroot reads them
    assert inside["container_env"]["MY_VAR"] == "plain" and inside["container_env"]["TETHER_CONTAINER"] == "1"
    assert inside["container_env"]["TMPDIR"] == "/tmp" and "PATH" not in ran.stderr
    assert [e[:2] for e in inside["fstab"]] == [[str(world["rank"] / "tmp"), "/tmp"],
                                                 [str(world["rank"] / "work"), "/run/tether/workdir"]]
    assert inside["rc"] == '    exec "$@"\n'           # the conf's rc(), as enroot writes it
    assert not (world["rank"] / "work" / ".tether-started").exists()
    # the second rank: no create, the same root
    fakes.configure(exit_code=3)
    try:
        ran = run(world["base"] / "img.sqsh", fresh=False, MY_VAR="plain", TETHER_RUN_WHY_PYTHON="1",
                  SLURM_PROCID="1", RANK="1")
    finally:
        fakes.configure(exit_code=0)
    assert ran.returncode == 3 and "tether-run: python" not in ran.stderr, ran.stderr     # the command's code
    assert [c["argv"][1] for c in fakes.calls("enroot")] == ["start"]


def test_an_enroot_start_that_fails_before_the_command_is_concluded_by_the_python_launcher(world, enroot_rank):
    """enroot exiting 1 before the command ran (nothing written in the rank's work directory) is
    handed over with what happened: the Python launcher says enroot failed, runs nothing again,
    and the rank ends with enroot's code."""
    run, fakes, step = enroot_rank
    fakes.configure(exit_code=1)
    try:
        ran = run(world["base"] / "img.sqsh", MY_VAR="plain", TETHER_RUN_WHY_PYTHON="1")
    finally:
        fakes.configure(exit_code=0)
    assert ran.returncode == 1
    assert "tether-run: python: the run did not end cleanly" in ran.stderr
    assert "enroot exited 1 before the command in the container started" in ran.stderr, ran.stderr
    assert [c["argv"][1] for c in fakes.calls("enroot")] == ["create", "start"]


def test_a_slow_create_goes_to_the_python_launcher_which_waits_and_a_signal_in_the_wait_ends_the_rank(world):
    """A create still running after TR_START_QUIET_MS: the rank goes to the Python launcher (told
    the create is this rank's: it tells it as its own step), which waits for it and starts the root
    once -- no second create. And a rank waiting for its start turn ends at SIGTERM, as the Python
    launcher's would (no runtime to pass it to)."""
    import fcntl

    settings, log, step = logged_enroot(world, "slow-enroot-2", SLOW_ENROOT.replace(
        'exec sleep "$AHEAD_SLEEP"', 'sleep "$AHEAD_SLEEP"; mkdir -p "$ENROOT_DATA_PATH/$3"; exit 0'))
    launcher = real_launchers(world, settings, "slow")
    env = ahead_env(world, MY_VAR="plain", AHEAD_LOG=str(log), AHEAD_SLEEP="1.6", TETHER_RUN_WHY_PYTHON="1")
    try:
        ran = subprocess.run([str(launcher)], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             preexec_fn=_as(UID), timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert "tether-run: python: the step's container root takes a while" in ran.stderr
        assert [line.split()[1] for line in log.read_text().splitlines()] == ["create", "start"]
        # the root is there; another rank waits for its turn to start it, and a SIGTERM ends it
        with open(step / "enroot" / "start-tether-7.0.lock", "a") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)
            proc = subprocess.Popen([str(launcher)], env={**env, "AHEAD_SLEEP": ""}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, preexec_fn=_as(UID))
            time.sleep(0.5)
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGTERM, err
        assert [line.split()[1] for line in log.read_text().splitlines()] == ["create", "start"]    # none started
    finally:
        shutil.rmtree(step / "enroot", ignore_errors=True)


def test_many_ranks_of_a_node_wait_for_their_start_turns_in_c(world):
    """Eight ranks of a step on one node at once, each start taking a while: the root is made once,
    and the ranks that find it there wait for their start turn without the node's lock -- none is
    handed to the Python launcher for a create that is long done."""
    settings, log, step = logged_enroot(world, "turns-enroot", SLOW_ENROOT.replace(
        'exec sleep "$AHEAD_SLEEP"', 'sleep 0.2; mkdir -p "$ENROOT_DATA_PATH/$3"; exit 0').replace(
        "exit 0\n", '[ "$1" = start ] && sleep 0.3\nexit 0\n'))
    launcher = real_launchers(world, settings, "turns")
    try:
        ranks = [subprocess.Popen([str(launcher)], env=ahead_env(world, MY_VAR="plain", AHEAD_LOG=str(log),
                                                                 AHEAD_SLEEP="1", TETHER_RUN_WHY_PYTHON="1",
                                                                 SLURM_PROCID=str(r), RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL, preexec_fn=_as(UID)) for r in range(8)]
        ended = [p.communicate(timeout=120) + (p.returncode,) for p in ranks]
    finally:
        shutil.rmtree(step / "enroot", ignore_errors=True)
    assert all(code == 0 for _, _, code in ended), ended
    assert not any("tether-run" in err for _, err, _ in ended), [err for _, err, _ in ended]
    calls = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(calls) == ["create"] + ["start"] * 8, calls

"""The container wrapper without a cluster: launch specs, the environment contract, each runtime's
exact argv, the Apptainer image cache, and `tether run` end to end through fake runtime executables
that record their argv and environment (Apptainer, Singularity and Enroot are not installable here).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tether.container.environment import contract_table, passed_from_host
from tether.container.images import DEFAULT_USER_CACHE, ImageCache, image_key, user_cache_dir
from tether.container.runtimes import adapter, available
from tether.container.runtimes.enroot import enroot_uri
from tether.container.spec import (
    CONTAINER_WORKDIR, LaunchError, LaunchSpec, Mount, check_container_options, parse_mounts, spec_from_env,
)

from helpers import REPO, alive, wait_until  # noqa: E402
TETHER = [sys.executable, "-m", "tether.cli.main"]

HOST = {
    "PATH": "/usr/bin:/bin", "HOME": "/home/u", "LD_PRELOAD": "/x.so", "PYTHONPATH": "/p",
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "MASTER_ADDR": "n1", "MASTER_PORT": "21408",
    "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "PMIX_RANK": "3",
    "CUDA_VISIBLE_DEVICES": "0,1", "TETHER_SLOT_IDS": "0,1", "TETHER_RANK_DIR": "/jobs/42/n2/step-0/rank-3",
    "TMPDIR": "/jobs/42/n2/step-0/rank-3/tmp", "APPTAINER_BIND": "/evil", "APPTAINERENV_X": "1",
    "CONTAINERS_CONF": "/etc/c.conf", "MYVAR": "a,b\nc 'q' $(x)", "OTHER": "no",
    "BASH_FUNC_f%%": "() { :; }",
}


def spec(**kw) -> LaunchSpec:
    base = dict(image="/images/busybox.sif", runtime="apptainer", command=("python", "train.py"),
                rank_dir="/jobs/42/n2/step-0/rank-3", job_id="42", step_id="0", rank="3")
    base.update(kw)
    return LaunchSpec(**base)


# ---- launch specs -----------------------------------------------------------------------------
def test_mounts_parse_and_refuse_what_would_break_a_command_line():
    assert parse_mounts("/data:/data:ro, /scratch:/s,/opt") == (
        Mount("/data", "/data", True), Mount("/scratch", "/s"), Mount("/opt", "/opt"))
    for bad, why in (("data:/d", r"the source must be an absolute path, a relative path .* \(./data for"),
                     ("/a:/b:rx", "unknown flag .rx."), ("/a:d", r"the target must be .* \(./d\)"),
                     ("/a:/tmp", "tether's own"), ("/a:/run/tether/workdir", "tether's own"), ("/a:./", "tether's own"),
                     ("/a:/b:ro:x", "unknown flag 'ro:x'"), ("/a::ro", "SRC:DST"), (":/b", "SRC:DST"),
                     ("devpts:/d", "the source must be")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


def test_spec_from_the_task_environment():
    env = {**HOST, "TETHER_CONTAINER_IMAGE": "docker://busybox", "TETHER_CONTAINER_MOUNTS": "/d:/d:ro",
           "TETHER_CONTAINER_ENV": "MYVAR", "TETHER_CONTAINER_WRITABLE": "1",
           "TETHER_JOB_SLOT_TYPE": "rocm"}
    s = spec_from_env(env, ["cmd"], default_runtime="podman")
    assert (s.runtime, s.workdir, s.writable, s.gpus, s.slot_type) == ("podman", CONTAINER_WORKDIR, True,
                                                                        ("0", "1"), "rocm")
    assert (s.instance, s.mounts, s.env_names) == ("tether-42-0-3", (Mount("/d", "/d", True),), ("MYVAR",))
    with pytest.raises(LaunchError, match="no container image"):
        spec_from_env(HOST, ["cmd"], default_runtime="podman")
    with pytest.raises(LaunchError, match="expected one of apptainer, singularity, podman, enroot"):
        spec_from_env({"TETHER_CONTAINER_IMAGE": "x", "TETHER_CONTAINER_RUNTIME": "docker"}, ["c"],
                      default_runtime="podman")
    with pytest.raises(LaunchError, match="--container-name="):
        spec_from_env({"TETHER_CONTAINER_IMAGE": "x", "TETHER_CONTAINER_NAME": "a/b"}, ["c"],
                      default_runtime="podman")


def test_submit_time_validation_gives_the_run_sides_messages():
    check_container_options({"slots": "2"}, "podman")                      # no container options
    check_container_options({"container-image": "/i", "container-mounts": "/a:/b"}, "podman")
    with pytest.raises(LaunchError, match="need --container-image"):
        check_container_options({"container-writable": "1"}, "podman")
    check_container_options({"container-image": "/i", "container-name": "dev"}, "podman")
    with pytest.raises(LaunchError, match="--container-name: apptainer keeps no container between steps"):
        check_container_options({"container-image": "/i", "container-name": "dev"}, "apptainer")
    check_container_options({"container-image": "/i", "container-name": "dev",
                             "container-runtime": "enroot"}, "podman")
    # pyxis's --container-readonly is the default; with --container-writable it is a contradiction
    check_container_options({"container-image": "/i", "container-readonly": "1"}, "podman")
    with pytest.raises(LaunchError, match="--container-writable and --container-readonly ask for opposite"):
        check_container_options({"container-image": "/i", "container-readonly": "1", "container-writable": "1"},
                                "podman")
    assert not spec_from_env({"TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_READONLY": "1"}, ["c"],
                             default_runtime="podman").writable


# ---- the environment contract ----------------------------------------------------------------
def test_contract_inherits_the_job_environment_but_where_the_image_must_win():
    passed = passed_from_host(HOST, spec(env_names=("PYTHONPATH", "APPTAINER_BIND")))
    assert set(passed) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
                           "SLURM_STEP_ID", "SLURM_PROCID", "PMIX_RANK", "CUDA_VISIBLE_DEVICES",
                           "TETHER_SLOT_IDS", "MYVAR", "OTHER", "PYTHONPATH"}
    assert passed["MYVAR"] == HOST["MYVAR"] and passed["PYTHONPATH"] == "/p"   # named: the host's value
    # never: host paths, tether's own (TMPDIR is set inside), runtime control (even when named),
    # invalid names; the image's own: PATH, HOME, LD_*
    assert not {"TETHER_RANK_DIR", "TMPDIR", "APPTAINER_BIND", "APPTAINERENV_X", "CONTAINERS_CONF",
                "BASH_FUNC_f%%", "LD_PRELOAD", "HOME", "PATH"} & set(passed)
    shell = {"PWD": "/h", "OLDPWD": "/o", "SHLVL": "2", "_": "/bin/env", "BASH_ENV": "/h/.b", "ENV": "/h/.e",
             "LD_LIBRARY_PATH": "/l", "LD_AUDIT": "/a", "PYTHONHOME": "/py", "HF_HOME": "/hf", "OMP_PLACES": "cores"}
    assert set(passed_from_host(shell, spec())) == {"HF_HOME", "OMP_PLACES"}
    assert passed_from_host({"TMPDIR": "/host/tmp"}, spec(rank_dir=None)) == {}     # the runtime's default
    assert passed_from_host({"TMPDIR": "/host/tmp"}, spec(rank_dir=None, env_names=("TMPDIR",))) == {
        "TMPDIR": "/host/tmp"}


def test_contract_allowlist_mode_passes_rank_scheduler_and_named_variables_only():
    passed = passed_from_host(HOST, spec(env_names=("MYVAR", "PATH", "APPTAINER_BIND")), "allowlist")
    assert set(passed) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
                           "SLURM_STEP_ID", "SLURM_PROCID", "PMIX_RANK", "CUDA_VISIBLE_DEVICES",
                           "TETHER_SLOT_IDS", "MYVAR", "PATH"}
    with pytest.raises(ValueError, match="expected one of inherit, allowlist"):
        passed_from_host(HOST, spec(), "everything")


def test_contract_table_is_in_the_readme():
    assert contract_table() in (REPO / "README.md").read_text()


# ---- exact argv per runtime --------------------------------------------------------------------
def test_apptainer_argv_and_environment(tmp_path):
    image = tmp_path / "busybox.sif"
    image.write_text("sif")
    s = spec(image=str(image), mounts=(Mount("/data", "/data", True),), env_names=("MYVAR",),
             gpus=("0", "1"), writable=True, workdir="/src")
    launch = adapter("apptainer", {"binary": "/opt/apptainer/bin/apptainer", "args": ["--silent"]}).launch(s, HOST)
    assert launch.argv == [
        "/opt/apptainer/bin/apptainer", "exec", "--silent", "--cleanenv",
        "--bind", "/jobs/42/n2/step-0/rank-3/tmp:/tmp", "--bind", "/jobs/42/n2/step-0/rank-3/work:/run/tether/workdir",
        "--bind", "/data:/data:ro", "--pwd", "/src", "--nv", "--writable-tmpfs", str(image), "python", "train.py"]
    assert not launch.supervise
    assert launch.env["APPTAINERENV_MYVAR"] == HOST["MYVAR"] and launch.env["APPTAINERENV_RANK"] == "3"
    assert (launch.env["APPTAINERENV_TETHER_CONTAINER"], launch.env["APPTAINERENV_TMPDIR"],
            launch.env["APPTAINERENV_TETHER_WORK_DIR"]) == ("1", "/tmp", "/run/tether/workdir")
    assert "APPTAINERENV_X" not in launch.env            # the user's own injection is dropped
    assert "APPTAINERENV_PATH" not in launch.env and "APPTAINERENV_TETHER_RANK_DIR" not in launch.env
    # inherited, under the prefix only: a large environment is not doubled for execve
    assert launch.env["APPTAINERENV_OTHER"] == "no" and "OTHER" not in launch.env and "RANK" not in launch.env
    assert launch.env["PATH"] == HOST["PATH"] and launch.env["HOME"] == HOST["HOME"]   # apptainer's own
    strict = adapter("apptainer", {}, environment="allowlist").launch(s, HOST)
    assert "APPTAINERENV_OTHER" not in strict.env and strict.env["APPTAINERENV_MYVAR"] == HOST["MYVAR"]


def test_apptainer_says_which_names_its_prefix_cannot_set(tmp_path, capsys):
    image = tmp_path / "busybox.sif"
    image.write_text("sif")
    launch = adapter("apptainer", {}).launch(spec(image=str(image), env_names=("HOME",)),
                                             {**HOST, "APPEND_PATH": "/x"})
    assert "APPTAINERENV_HOME" not in launch.env and "APPTAINERENV_APPEND_PATH" not in launch.env
    assert "not passed into the apptainer container: APPEND_PATH, HOME" in capsys.readouterr().err


def test_singularity_uses_its_own_names_and_rocm(tmp_path, fake_runtimes):
    sandbox = tmp_path / "rootfs"
    sandbox.mkdir()
    binary = str(fake_runtimes.bin_dir / "singularity")      # asked for its version: --rocm needs 3.5
    launch = adapter("singularity", {"binary": binary}).launch(
        spec(image=str(sandbox), runtime="singularity", gpus=("2",), slot_type="rocm"), HOST)
    assert launch.argv[:3] == [binary, "exec", "--cleanenv"] and "--rocm" in launch.argv
    assert "--nv" not in launch.argv and launch.env["SINGULARITYENV_RANK"] == "3"


@pytest.fixture(autouse=True)
def _podman_store_in_tmp(tmp_path, monkeypatch):
    """The podman adapter's default store, made by each launch, goes under the test's tmp_path."""
    monkeypatch.setattr("tether.container.runtimes.podman.DEFAULT_STORE", str(tmp_path / "podman-store-{uid}"))
    monkeypatch.setattr("tether.container.runtimes.enroot.DEFAULT_STORE", str(tmp_path / "enroot-store-{uid}"))


def test_podman_argv_keeps_values_off_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    s = spec(image=str(rootfs), runtime="podman", env_names=("MYVAR",), gpus=("0",),
             mounts=(Mount("/data", "/data"),))
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text('cdiVersion: "0.5.0"\nkind: "nvidia.com/gpu"\ndevices: []\n')
    launch = adapter("podman", {"args": ["--runtime", "runc"], "env": {"CONTAINERS_CONF": "/c"},
                                "cdi_spec_dirs": [str(cdi)]}).launch(s, HOST)
    keep_id = ["--userns=keep-id"] if os.getuid() != 0 else []
    run = "/run/tether-podman" if os.getuid() == 0 else f"/run/tether/{os.getuid()}/tether-podman"
    passed = ["LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MYVAR", "OTHER", "PMIX_RANK", "RANK",
              "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "TETHER_SLOT_IDS", "WORLD_SIZE"]
    (names_fd,) = [fd for fd in launch.fds if fd >= 10]
    assert launch.fds == {names_fd: names_fd}                # kept open for podman, at 10 or above
    assert Path(f"/proc/self/fd/{names_fd}").read_text().split() == passed   # podman copies the values
    assert launch.argv == [
        "podman", "run", "--runtime", "runc", "--root", f"{tmp_path}/podman-store-{os.getuid()}/storage",
        "--runroot", f"{run}/storage",
        "--log-level=fatal", "--rm", "--name", "tether-42-0-3",
        "--cidfile", "/jobs/42/n2/step-0/rank-3/.cid",
        "--label", "tether.job=42", "--label", "tether.step=42.0", "--network=host", "--pid=host",
        "--log-driver=passthrough", *keep_id, "--entrypoint=",
        "--read-only", "--env-file", f"/dev/fd/{names_fd}",
        "--env", "TETHER_CONTAINER=1", "--env", "TMPDIR=/tmp", "--env", "TETHER_WORK_DIR=/run/tether/workdir",
        "--env", "CUDA_VISIBLE_DEVICES=0",
        "--volume", "/jobs/42/n2/step-0/rank-3/tmp:/tmp", "--volume", "/jobs/42/n2/step-0/rank-3/work:/run/tether/workdir",
        "--volume", "/data:/data", "--workdir", "/run/tether/workdir", "--device", "nvidia.com/gpu=0",
        "--rootfs", str(rootfs), "python", "train.py"]
    assert HOST["MYVAR"] not in launch.argv and launch.env["CONTAINERS_CONF"] == "/c"
    assert launch.supervise and (launch.container, launch.monitor) == ("tether-42-0-3", "conmon")
    assert launch.marker == "/jobs/42/n2/step-0/.cleanup-3"
    assert launch.marker_data == {"runtime": "podman", "container": "tether-42-0-3"}      # data, no command
    image = adapter("podman", {}).launch(spec(image="docker://busybox:1.36", runtime="podman", writable=True), HOST)
    assert image.argv[-3:] == ["docker.io/library/busybox:1.36", "python", "train.py"] and "--read-only" not in image.argv
    writable = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", writable=True), HOST)
    assert writable.argv[-4:-2] == ["--rootfs", f"{rootfs}:O"] and "--read-only" not in writable.argv
    (tmp_path / "x.sif").write_text("")
    with pytest.raises(LaunchError, match="not a file"):
        adapter("podman", {}).launch(spec(image=str(tmp_path / "x.sif"), runtime="podman"), HOST)
    with pytest.raises(LaunchError, match="--container-name needs the job's directories"):
        adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", name="dev", rank_dir=None), HOST)
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: True)   # srun --pty
    monkeypatch.setattr("os.isatty", lambda fd: True)
    on_tty = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), HOST)
    assert "--log-driver=passthrough" not in on_tty.argv          # podman refuses it on a terminal
    # with stdin (without it an interactive shell ended at once) and a terminal inside
    assert on_tty.argv[on_tty.argv.index("--interactive") + 1] == "--tty"
    monkeypatch.setattr("os.isatty", lambda fd: fd != 0)        # output to a terminal, input piped
    piped = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), HOST)
    assert "--interactive" in piped.argv and "--tty" not in piped.argv


def test_enroot_imports_creates_starts_and_removes(tmp_path):
    s = spec(image="docker://nvcr.io/nvidia/pytorch:24.01-py3", runtime="enroot",
             rank_dir=str(tmp_path / "42/n2/step-0/rank-3"), mounts=(Mount("/data", "/data", True),),
             env_names=("MYVAR",), writable=True, gpus=("0",))
    launch = adapter("enroot", {}).launch(s, HOST)
    node = tmp_path / "42/n2/step-0"                          # the step's directory holds the container
    store = tmp_path / f"enroot-store-{os.getuid()}"            # the user's store on the node, the image
    sqsh = f"{store}/{image_key(enroot_uri(s.image))[:24]}.sqsh"   # one file per image, whatever its spelling
    partial = f"{sqsh[:-5]}.{os.getpid()}.partial"
    assert launch.env["ENROOT_DATA_PATH"] == f"{node}/enroot/data"
    (importing, finishing, creating) = launch.before
    assert importing == (["enroot", "import", "--output", partial, "docker://nvcr.io#nvidia/pytorch:24.01-py3"], sqsh,
                         f"importing {s.image} (enroot)")
    assert callable(finishing[0]) and finishing[1] == sqsh       # renamed into place only once complete
    assert creating == (["enroot", "create", "--name", "tether-42-0-3", sqsh], f"{node}/enroot/data/tether-42-0-3",
                        f"unpacking the container root of {s.image} (enroot create)")
    assert launch.lock == f"{store}/.import-lock"             # the user's ranks and jobs on the node
    assert os.stat(store).st_mode & 0o777 == 0o700
    per_step = adapter("enroot", {"store": ""}).launch(s, HOST)         # no store: per step, as before
    assert per_step.before[0][1] == f"{node}/enroot/{image_key(enroot_uri(s.image))[:24]}.sqsh"
    assert per_step.lock == f"{node}/enroot/.import-lock"
    argv = launch.argv
    conf = f"{node}/enroot/environ-3.conf"
    rc = f"{node}/enroot/rc-3"          # --no-container-entrypoint (the default): the command itself
    assert argv[:7] == ["enroot", "start", "--rw", "--rc", rc, "--conf", conf]
    assert Path(rc).read_text().endswith('exec "$@"\n')
    assert ["--env", "TETHER_CONTAINER=1"] in [argv[i:i + 2] for i in range(len(argv))]
    assert HOST["MYVAR"] not in " ".join(argv) and oct(os.stat(conf).st_mode & 0o777) == "0o600"
    text = Path(conf).read_text()
    assert "OTHER=no\n" in text and "RANK=3\n" in text and "PATH=" not in text
    assert "MYVAR" not in text                      # a line break: enroot's file cannot carry it
    assert "--mount" not in argv and "NVIDIA_VISIBLE_DEVICES=all" in argv     # mounts: in the conf's mounts()
    assert text.split("mounts() {\n", 1)[1].splitlines()[1:4] == [
        f"{s.rank_dir}/tmp /tmp none x-create=dir,bind",
        f"{s.rank_dir}/work /run/tether/workdir none x-create=dir,bind", "/data /data none x-create=auto,rbind,ro"]
    assert argv[-8:] == ["tether-42-0-3", "/bin/sh", "-c", 'cd "$1" || exit 125; shift; exec "$@"', "sh",
                         CONTAINER_WORKDIR, "python", "train.py"]
    assert launch.after == [["enroot", "remove", "--force", "tether-42-0-3"]]
    named = adapter("enroot", {}).launch(spec(image="docker://busybox", runtime="enroot", name="dev",
                                              rank_dir=s.rank_dir), HOST)
    assert named.after == [] and "tether-42-dev" in named.argv
    assert named.env["ENROOT_DATA_PATH"] == f"{tmp_path}/42/n2/enroot/data"   # kept for the job's steps
    assert enroot_uri("docker://busybox:1.36") == "docker://busybox:1.36"
    assert enroot_uri("docker://localhost:5000/a/b") == "docker://localhost:5000#a/b"


def test_every_configured_runtime_has_an_adapter():
    from tether.hooks.config import RUNTIMES

    assert set(RUNTIMES) <= set(available())
    with pytest.raises(LaunchError, match="unknown container runtime"):
        adapter("docker", {})


# ---- the image cache -------------------------------------------------------------------------
@pytest.fixture
def fake_apptainer(fake_runtimes):
    """The testing kit's apptainer (its `build` records each conversion and takes build_seconds)."""
    fake_runtimes.configure(build_seconds=0.5)
    return fake_runtimes


def _conversions(fakes) -> list[str]:
    return [c["source"] for c in fakes.calls("apptainer") if c["argv"][1] == "build"]


def _ensure_in_subprocess(root, fakes, source, env):
    exe = fakes.bin_dir / "apptainer"
    code = (f"from tether.container.images import ImageCache;"
            f"print(ImageCache({str(root)!r}).ensure({source!r}, build=[{str(exe)!r}, 'build']))")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_six_concurrent_first_uses_convert_exactly_once(tmp_path, fake_apptainer):
    root = tmp_path / "images"
    root.mkdir()
    env = dict(os.environ)
    procs = [_ensure_in_subprocess(root, fake_apptainer, "docker://busybox:1.36", env) for _ in range(6)]
    outputs = [p.communicate(timeout=60) for p in procs]
    paths = {out.strip() for out, _ in outputs}
    assert all(p.returncode == 0 for p in procs)
    assert _conversions(fake_apptainer) == ["docker://busybox:1.36"]        # one conversion
    (path,) = paths
    assert Path(path).read_bytes() == b"SIF_MAGICdocker://busybox:1.36" and Path(path).parent == root
    # progress: the converting rank says what and how long; ranks that came meanwhile say they wait
    errs = "".join(err for _, err in outputs)
    assert errs.count("tether: converting docker://busybox:1.36 into a SIF image (apptainer) ...") == 1
    assert errs.count("tether: converted docker://busybox:1.36: 0.0 MB in ") == 1
    assert errs.count("tether: waiting for another rank's conversion of docker://busybox:1.36") >= 1
    assert not [e for e in os.listdir(root) if e.endswith(".partial")]
    assert [(i.source, i.path) for i in ImageCache(str(root)).entries()] == [("docker://busybox:1.36", path)]


def test_killed_or_failed_conversion_never_becomes_visible(tmp_path, fake_apptainer):
    root = tmp_path / "images"
    root.mkdir()
    env = dict(os.environ)
    fake_apptainer.configure(build_seconds=30)
    proc = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    deadline = time.monotonic() + 20
    while not _conversions(fake_apptainer) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    cache = ImageCache(str(root))
    assert cache.lookup("docker://big") is None and list(cache.entries()) == []
    fake_apptainer.configure(build_seconds=0, build_fails=True)
    failed = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    _, err = failed.communicate(timeout=60)
    assert failed.returncode != 0 and "cannot convert docker://big into a SIF image" in err
    assert "manifest unknown" in err
    assert cache.lookup("docker://big") is None
    assert not [e for e in os.listdir(root) if e.endswith(".partial")]     # the killed one's is gone too
    fake_apptainer.configure(build_fails=False)
    ok = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    assert ok.communicate(timeout=60)[0].strip() == str(root / (image_key("docker://big") + ".sif"))
    assert cache.prune(0) == [str(root / (image_key("docker://big") + ".sif"))]
    assert list(cache.entries()) == []


def _as_user(uid: int, fn):
    """Run ``fn()`` in a child process with uid/gid ``uid`` (the test runs as root); its result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = repr(fn())
        except Exception as exc:  # reported to the parent
            result = repr(f"{type(exc).__name__}: {exc}")
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    return eval(out)  # noqa: S307 - our own repr


def test_nobody_uses_an_image_another_user_planted(tmp_path):
    """The shared cache counts only root's regular files; a user's cache only that user's."""
    root = tmp_path / "images"
    root.mkdir()
    planted = root / (image_key("docker://python:3") + ".sif")
    planted.write_text("evil")
    os.chown(planted, 1002, 1002)
    assert ImageCache(str(root), uid=0).lookup("docker://python:3") is None
    assert ImageCache(str(root), uid=1003, user_dir=str(tmp_path / "c")).lookup("docker://python:3") is None
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / (image_key("docker://python:3") + ".sif")).write_text("evil")
    os.chown(theirs / (image_key("docker://python:3") + ".sif"), 1002, 1002)
    assert ImageCache(str(root), uid=1003, user_dir=str(theirs)).lookup("docker://python:3") is None
    os.chown(theirs, 1002, 1002)
    with pytest.raises(LaunchError, match="is not a directory of uid 1003"):
        ImageCache(str(root), uid=1003, user_dir=str(theirs)).ensure("docker://x", build=["false"])


def test_root_prune_never_touches_files_a_user_controls(tmp_path):
    """Regression (issue 12): a user planted users/evil -> a victim's directory in the old 1777 area,
    and root's prune deleted the victim's files. Root now prunes only its shared cache."""
    root = tmp_path / "images"
    (root / "users").mkdir(parents=True)
    os.chmod(root / "users", 0o1777)
    victim = tmp_path / "victim"
    victim.mkdir()
    key = image_key("docker://app")
    for suffix in (".sif", ".json", ".lock"):
        (victim / (key + suffix)).write_text("{}" if suffix == ".json" else "mine")
    old = time.time() - 100 * 86400
    for f in victim.iterdir():
        os.utime(f, (old, old))
    (root / "users" / "evil").symlink_to(victim)
    (root / "users" / "1003").mkdir()
    os.chown(root / "users" / "1003", 1002, 1002)
    cache = ImageCache(str(root), uid=0)
    assert cache.prune(1) == [] and list(cache.entries()) == []
    assert sorted(p.name for p in victim.iterdir()) == sorted(key + s for s in (".sif", ".json", ".lock"))
    with pytest.raises(LaunchError, match="give a number of days >= 0"):
        cache.prune(-5)


def test_ls_skips_a_fifo_named_like_metadata_instead_of_hanging(public_dir):
    tmp_path = public_dir
    cache_dir = tmp_path / "mine"
    cache_dir.mkdir()
    key = image_key("docker://a")
    (cache_dir / (key + ".sif")).write_text("sif")
    os.mkfifo(cache_dir / (key + ".json"))
    os.chown(cache_dir, 1003, 1003)
    for f in cache_dir.iterdir():
        os.chown(f, 1003, 1003, follow_symlinks=False)
    signal.alarm(20)                                   # the old code blocked here forever
    try:
        entries = _as_user(1003, lambda: [(i.source, i.size) for i in ImageCache(
            str(tmp_path / "shared"), uid=1003, user_dir=str(cache_dir)).entries()])
    finally:
        signal.alarm(0)
    assert entries == [("?", 3)]


def test_a_users_conversion_goes_to_their_own_cache(public_dir):
    from tether.testing.runtimes import FakeRuntimes

    tmp_path = public_dir
    exe = FakeRuntimes(tmp_path / "fakes").bin_dir / "apptainer"          # reachable by the user
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 1003, 1003)
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, "HOME": str(home)}
    mine = user_cache_dir(DEFAULT_USER_CACHE, 1003, str(home))
    result = _as_user(1003, lambda: ImageCache(str(shared), user_dir=mine).ensure(
        "docker://x:1", build=[str(exe), "build"], env=env))
    assert result == str(home / ".cache" / "tether" / "images" / (image_key("docker://x:1") + ".sif"))
    assert os.listdir(shared) == []


# ---- the leftover cleanup: markers are data --------------------------------------------------------
def _cleanup_in(where: Path, settings: dict, uid: int = 1003):
    """run_leftovers as the user ``uid`` (as slurmstepd runs it), for the markers under ``where``."""
    from tether.container.cleanup import run_leftovers

    return _as_user(uid, lambda: run_leftovers(str(where), settings))


def test_cleanup_runs_only_tethers_own_removal_for_what_a_marker_names(public_dir):
    """Regression (issue 12): a planted marker made the cleanup run the commands it named."""
    step = public_dir / "step-0"
    step.mkdir()
    log = public_dir / "calls"
    fake = public_dir / "podman"
    fake.write_text(f"#!/bin/sh\necho \"podman $*\" >> {log}\n"
                    f"[ \"$1\" = inspect ] && echo {'ab' * 32}\n[ \"$1\" = container ] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    runc = public_dir / "runc"
    runc.write_text(f"#!/bin/sh\necho \"runc $*\" >> {log}\n")
    runc.chmod(0o755)
    xdg = public_dir / "xdg"
    (xdg / "runc" / ("ab" * 32)).mkdir(parents=True)             # the state podman 4.3 leaves
    pwned = public_dir / "pwned"
    markers = {
        # an earlier release's run directory field: never read (the adapter says where podman runs)
        ".cleanup-0": {"runtime": "podman", "container": "tether-7-0-0", "xdg_runtime_dir": str(public_dir)},
        ".cleanup-1": {"commands": [["touch", str(pwned)]], "env": {}},                # the old format
        ".cleanup-2": {"runtime": "podman", "container": "x; touch " + str(pwned)},
        ".cleanup-3": {"runtime": "/bin/sh", "container": "tether-7-0-3"},
        ".cleanup-4.999": {"runtime": "podman", "container": "tether-7-0-4"},           # half-written
    }
    for name, data in markers.items():
        (step / name).write_text(json.dumps(data))
    os.mkfifo(step / ".cleanup-5")
    for p in [public_dir, step, xdg, *step.iterdir()]:
        os.chown(p, 1003, 1003)
    settings = {"podman": {"binary": str(fake), "args": ["--runtime", str(runc)], "env": {"XDG_RUNTIME_DIR": str(xdg)},
                           "store": "/var/tmp/store-{uid}"}}
    signal.alarm(30)
    try:
        assert _cleanup_in(step, settings) == 0
    finally:
        signal.alarm(0)
    # the user's store (its run state in podman's run directory, the config's), as the launch used it
    store = f"--root /var/tmp/store-1003/storage --runroot {xdg}/tether-podman/storage"
    assert log.read_text().splitlines() == [
        f"podman inspect --runtime {runc} {store} --format {{{{.Id}}}} tether-7-0-0",
        f"podman rm --runtime {runc} {store} --force --ignore --time 0 tether-7-0-0",
        f"podman container exists --runtime {runc} {store} tether-7-0-0",
        f"runc --root {xdg}/runc delete --force {'ab' * 32}"]
    assert not pwned.exists()


@pytest.mark.parametrize("stays_for,removed", [(2, True), (99, False)])
def test_podman_removal_counts_only_a_container_podman_no_longer_knows(tmp_path, stays_for, removed):
    """Regression (issue 12, soak): `podman rm` answered 0 at a time limit and left a stopped
    container (its record stayed, the marker went). Removal now checks `podman container exists`
    and tries again; a container that stays keeps its marker for the cleanup run."""
    count = tmp_path / "rm-count"
    fake = tmp_path / "podman"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          rm) echo x >> {count}; exit 0 ;;
          container) [ "$(wc -l < {count})" -gt {stays_for} ] && exit 1; exit 0 ;;
        esac
        exit 0
        """))
    fake.chmod(0o755)
    count.write_text("")
    assert adapter("podman", {"binary": str(fake)}).remove("tether-1-0-0", {"PATH": "/usr/bin:/bin"},
                                                          new_session=False) is removed
    assert len(count.read_text().splitlines()) == (3 if removed else 4)


# ---- tether run, end to end through the testing kit's fake runtimes (tether.testing.runtimes) ----------
@pytest.fixture
def runtime_config(tmp_path):
    config = tmp_path / "tether.yaml"
    config.write_text(f"container: {{apptainer_image_root: {tmp_path / 'images'}, "
                      f"enroot: {{store: '{tmp_path}/enroot-{{uid}}'}}, podman: {{store: '{tmp_path}/podman-{{uid}}'}}}}\n")
    return config


def _tether_run(tmp_path, fakes, config, *args, user: int | None = None, rank_dir: Path | None = None,
                cwd: str = "/", **env):
    """``tether run ARGS`` with the fakes first on PATH (as ``user`` when given, in ``cwd``); its result."""
    rank_dir = rank_dir or tmp_path / "7/n1/step-2/rank-1"
    run_env = {"PATH": fakes.path_env(), "TETHER_CONFIG": str(config), "RANK": "1", "SLURM_JOB_ID": "7",
               "SLURM_STEP_ID": "2", "HOME": str(rank_dir.parent), "TETHER_RANK_DIR": str(rank_dir),
               "SECRET": "s", **env}
    preexec = None
    if user is not None:
        def preexec():
            os.setgroups([])
            os.setgid(user)
            os.setuid(user)
    return subprocess.run([*TETHER, "run", *args], env=run_env, capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec, cwd=cwd)


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_tether_run_execs_apptainer_in_place(tmp_path, fake_runtimes, runtime_config, runtime):
    image = tmp_path / "img.sif"
    image.write_text("")
    fake_runtimes.configure(exit_code=3)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, f"--container-runtime={runtime}",
                       f"--container-image={image}", "--container-env=SECRET", "--", "echo", "a b,c",
                       FAKE_ONLY_ON_HOST="x")
    assert proc.returncode == 3, proc.stderr
    (call,) = fake_runtimes.calls(runtime)
    assert call["argv"][1:3] == ["exec", "--cleanenv"] and call["command"] == ["echo", "a b,c"]
    assert "--env" not in call["argv"] and call["image"] == str(image)
    inside = call["container_env"]                      # what the program sees
    assert inside["RANK"] == "1" and inside["SECRET"] == "s" and inside["FAKE_ONLY_ON_HOST"] == "x"
    assert inside["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # the runtime's
    assert not any(k.startswith(("APPTAINERENV_", "SINGULARITYENV_")) for k in inside)


def test_singularity_before_3_6_gets_every_value_without_exec_env(tmp_path, fake_runtimes, runtime_config):
    """Regression (issue 13, item 4): SingularityCE 3.4 has no `exec --env`: tether's launch failed
    with "unknown flag: --env" and a page of help. Every value now goes in SINGULARITYENV_<NAME>."""
    fake_runtimes.configure(profiles={"singularity": "singularity-3.4"})
    image = tmp_path / "img.sif"
    image.write_text("")
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=singularity",
                       f"--container-image={image}", "--container-env=SECRET", "--", "true",
                       MASTER_ADDR="n1", MASTER_PORT="20112")
    assert proc.returncode == 0, proc.stderr
    inside = fake_runtimes.calls("singularity")[-1]["container_env"]
    assert (inside["RANK"], inside["SECRET"], inside["MASTER_ADDR"], inside["MASTER_PORT"]) == ("1", "s", "n1", "20112")
    assert inside["TETHER_WORK_DIR"] == CONTAINER_WORKDIR
    # a ROCm rank needs --rocm (SingularityCE 3.5): one clear line, no runtime help page
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=singularity",
                       f"--container-image={image}", "--", "true", TETHER_SLOT_IDS="0",
                       TETHER_JOB_SLOT_TYPE="rocm")
    assert proc.returncode == 125
    assert "singularity 3.4.2-1 has no --rocm: SingularityCE 3.5 or newer (or Apptainer) is needed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_fake_runtimes_refuse_flags_their_version_does_not_know(tmp_path, fake_runtimes):
    image = tmp_path / "img.sif"
    image.write_text("")
    fake_runtimes.configure(profiles={"singularity": "singularity-3.4"})
    env = {"PATH": fake_runtimes.path_env()}
    old = subprocess.run(["singularity", "exec", "--env", "A=1", str(image), "true"], env=env, capture_output=True,
                         text=True)
    assert old.returncode == 1 and 'Error for command "exec": unknown flag: --env' in old.stderr
    new = subprocess.run(["apptainer", "exec", "--env", "A=1,B=2", str(image), "true"], env=env, capture_output=True,
                         text=True)
    assert new.returncode == 0 and fake_runtimes.calls("apptainer")[-1]["container_env"]["B"] == "2"
    bogus = subprocess.run(["apptainer", "exec", "--bogus", str(image), "true"], env=env, capture_output=True,
                           text=True)
    assert bogus.returncode == 1 and "unknown flag: --bogus" in bogus.stderr
    enroot = subprocess.run(["enroot", "start", "--bogus", "x"], capture_output=True, text=True,
                            env={**env, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert enroot.returncode == 1 and "Usage: enroot start" in enroot.stderr
    export = subprocess.run(["enroot", "export", "--arch", "x86_64", "x"], capture_output=True, text=True,
                            env={**env, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert export.returncode == 1 and "Usage: enroot export" in export.stderr      # import has --arch, export not
    run = subprocess.run(["apptainer", "run", "--bogus", str(image)], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and 'Error for command "run": unknown flag: --bogus' in run.stderr
    missing = subprocess.run(["apptainer", "exec", str(tmp_path / "none.sif"), "true"], env=env,
                             capture_output=True, text=True)
    assert missing.returncode == 255 and "could not open image" in missing.stderr


def test_tether_run_enroot_sequence_and_exit_code(tmp_path, fake_runtimes, runtime_config):
    fake_runtimes.configure(exit_code=4)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true")
    assert proc.returncode == 4, proc.stderr
    assert "tether: importing docker://busybox (enroot) ...\n" in proc.stderr      # what happens, said
    assert "tether: importing docker://busybox (enroot): done in " in proc.stderr
    calls = fake_runtimes.calls("enroot")
    assert [c["argv"][1] for c in calls] == ["import", "create", "start", "remove"]
    (started,) = fake_runtimes.calls("enroot-container")
    assert started["command"][-3:] == ["sh", CONTAINER_WORKDIR, "true"] and started["container_env"]["RANK"] == "1"
    step = tmp_path / "7/n1/step-2"
    assert calls[2]["paths"]["ENROOT_DATA_PATH"] == str(step / "enroot/data")
    assert calls[2]["paths"]["ENROOT_RUNTIME_PATH"] == str(step / "enroot/run")
    # a second launch in the step reuses the imported image: no second import
    fake_runtimes.configure(exit_code=0)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][4:] == ["create", "start", "remove"]
    # nor does another job's step on this node: the image is in the user's store (issue 14)
    other = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                        "--container-image=docker://busybox", "--", "true", rank_dir=tmp_path / "8/n1/step-0/rank-0",
                        SLURM_JOB_ID="8", SLURM_STEP_ID="0")
    assert other.returncode == 0, other.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][7:] == ["create", "start", "remove"]
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")].count("import") == 1


def test_enroot_runs_for_a_user_without_a_runtime_directory(public_dir):
    """Regression (issue 13, item 3): in a Slurm task (no XDG_RUNTIME_DIR) enroot's runtime path is
    /run/enroot, which a user cannot create: every rank failed `mkdir: cannot create directory
    '/run/enroot': Permission denied`. The fake enroot does that mkdir for real, as the user."""
    from tether.testing.runtimes import FakeRuntimes

    fake_runtimes = FakeRuntimes(public_dir / "fakes")              # reachable by the user
    runtime_config = public_dir / "tether.yaml"
    runtime_config.write_text("{}\n")
    rank_dir = public_dir / "7/n1/step-2/rank-1"
    rank_dir.mkdir(parents=True)
    for path in [public_dir / "7", public_dir / "7/n1", rank_dir.parent, rank_dir]:
        os.chown(path, 65534, 65534)
    sqsh = public_dir / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 60)                   # what unsquashfs -s recognizes
    proc = _tether_run(public_dir, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       f"--container-image={sqsh}", "--", "true", user=65534, rank_dir=rank_dir)
    assert proc.returncode == 0, proc.stderr
    paths = fake_runtimes.calls("enroot")[0]["paths"]
    assert paths["ENROOT_RUNTIME_PATH"] == str(rank_dir.parent / "enroot/run")
    assert (rank_dir.parent / "enroot/run").stat().st_uid == 65534
    # without tether's paths it fails as the real enroot does: the runtime path defaults to
    # ${XDG_RUNTIME_DIR:-/run}/enroot, a root-owned directory's child (here a stand-in for /run, so
    # the test does not depend on what this host's /run holds)
    run = public_dir / "run"
    run.mkdir()
    bare = subprocess.run(["enroot", "list"], capture_output=True, text=True,
                          env={"PATH": fake_runtimes.path_env(), "HOME": str(rank_dir), "XDG_RUNTIME_DIR": str(run)},
                          preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    assert bare.returncode == 1 and f"mkdir: cannot create directory '{run}/enroot': Permission denied" in bare.stderr


def test_tether_run_reports_a_missing_runtime_and_a_bad_image(tmp_path, fake_runtimes, runtime_config):
    image = tmp_path / "img.sif"
    image.write_text("")
    (fake_runtimes.bin_dir / "apptainer").unlink()
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, f"--container-image={image}", "--", "true")
    assert proc.returncode == 125 and "tether: cannot start the container runtime 'apptainer'" in proc.stderr
    assert "set container.apptainer.binary in tether's config" in proc.stderr     # issue 15: no <runtime>
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-image=/no/such.sif", "--", "true")
    assert proc.returncode == 125 and "no such file or directory on this node" in proc.stderr
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, f"--container-image={image}", "--")
    assert (proc.returncode, proc.stderr) == (2, "tether: no command: tether run [OPTIONS] -- COMMAND [ARGS...]\n")


@pytest.mark.parametrize("runtime", ["apptainer", "podman", "enroot"])
def test_tether_run_refuses_a_mount_whose_source_is_missing(tmp_path, fake_runtimes, runtime_config, runtime):
    """A --container-mounts (or container.mounts) source that is not on this node, or that the user
    cannot reach, is refused before the runtime runs (podman's own error came after a start and a
    retry); one that is there mounts."""
    image = tmp_path / "img.sif"
    image.write_text("")
    there = tmp_path / "data"
    there.mkdir()
    common = [f"--container-runtime={runtime}", f"--container-image={image}"]
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, *common,
                       f"--container-mounts={there}:/d,/no/such/dir:/x:ro", "--", "true")
    assert (proc.returncode, proc.stderr) == (
        125, "tether: --container-mounts: /no/such/dir: no such file or directory on this node\n")
    assert fake_runtimes.calls() == []                           # the runtime never ran
    site = tmp_path / "site.yaml"
    site.write_text(runtime_config.read_text().replace("container: {", "container: {mounts: ['/no/site:/site'], "))
    proc = _tether_run(tmp_path, fake_runtimes, site, *common, "--", "true")
    assert proc.returncode == 125 and \
        "tether: container.mounts in tether's config: /no/site: no such file or directory on this node" in proc.stderr
    assert fake_runtimes.calls() == []
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=apptainer",
                       f"--container-image={image}", f"--container-mounts={there}:/d", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert f"{there}:/d" in fake_runtimes.calls("apptainer")[0]["argv"]


def test_mount_sources_are_checked_as_the_user_reaches_them(tmp_path, monkeypatch):
    """check_mount_sources: what is wrong with a source, in the user's words."""
    from tether.container.spec import check_mount_sources

    (tmp_path / "file").write_text("")
    check_mount_sources(parse_mounts(f"{tmp_path}:/a,{tmp_path}/file:/b"))
    with pytest.raises(LaunchError, match=f"^--container-mounts: {tmp_path}/file/x: Not a directory$"):
        check_mount_sources(parse_mounts(f"{tmp_path}:/a,{tmp_path}/file/x:/b"))
    with pytest.raises(LaunchError, match=r"^container.mounts in tether's config: /nope: no such file"):
        check_mount_sources(parse_mounts(f"{tmp_path}:/a,/nope:/site"), admin=["/nope:/site"])

    def denied(path, *a, **kw):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(LaunchError, match=r"^--container-mounts: /x: permission denied \(you cannot reach it on this node"):
        check_mount_sources(parse_mounts("/x:/y"))


def test_supervised_runtime_keeps_double_forked_processes_and_forwards_signals(tmp_path):
    """The podman-like path: a 'runtime' that daemonizes a child stays our descendant; SIGTERM to the
    wrapper reaches the runtime and its descendants; the wrapper ends with the runtime's status."""
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( sleep 30 & echo $! > {tmp_path}/daemon.pid ) & )   # double fork, like conmon
        trap 'echo got-term > {tmp_path}/term; exit 7' TERM
        while :; do sleep 0.1; done
        """))
    runtime.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-c", _supervised(runtime, tmp_path / "cleaned")])
    deadline = time.monotonic() + 20
    while not (tmp_path / "daemon.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon = int((tmp_path / "daemon.pid").read_text())
    with open(f"/proc/{daemon}/stat") as fh:
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    assert ppid == proc.pid                                  # re-parented to the wrapper, not init
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    assert (tmp_path / "term").read_text() == "got-term\n" and (tmp_path / "cleaned").read_text() == "c1"
    # the double-forked 'conmon' got the SIGTERM too: every process below the runtime does, as Slurm
    # signals every process of a step (podman's runc keeps the container's out of Slurm's reach)
    deadline = time.monotonic() + 10
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon)


@pytest.mark.parametrize("record", ["the pause process", "another process"])
def test_the_launcher_never_waits_for_the_runtimes_own_pause_process(tmp_path, record):
    """Issue 46, 6: rootless podman's first command of a user on a node starts its pause process
    (catatonit -P), which outlives the container for the user's later podman commands and -- the
    launcher being a child subreaper -- becomes the launcher's child. The launcher waited its whole
    grace (5 s) for it in every step on a cold node. Now it still waits for the monitor finishing
    (conmon), but not for the pause process podman recorded: it ends that one itself, as the step's
    end would (left there, it cost the step a second of Slurm's). A record that names another
    process (stale: its pid reused) makes nothing the runtime's own."""
    bin_dir, run = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    for name in ("catatonit", "conmon"):          # processes with those command names
        shutil.copy("/bin/sleep", bin_dir / name)
    pause_file = run / "libpod" / "tmp" / "pause.pid"
    recorded = "pause" if record == "the pause process" else "monitor"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        mkdir -p {pause_file.parent}
        ( setsid {bin_dir}/catatonit 600 </dev/null >/dev/null 2>&1 & echo $! > {tmp_path}/pause )
        ( {bin_dir}/conmon 2 </dev/null >/dev/null 2>&1 & echo $! > {tmp_path}/monitor )
        cp {tmp_path}/{recorded} {pause_file}
        exit 0
        """))
    runtime.chmod(0o755)
    code = _supervised(runtime, tmp_path / "removed", monitor="conmon").replace(
        'monitor=\'conmon\'', f"monitor='conmon', runtime_own=(({str(pause_file)!r}, ('catatonit', 'podman pause')),)")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TETHER_RUN_TELL_REAPING": "1"},
                              capture_output=True, text=True, timeout=60)
        pause, monitor = (int((tmp_path / name).read_text()) for name in ("pause", "monitor"))
        assert proc.returncode == 0, proc.stderr
        if record == "the pause process":
            said = f"launcher=python reaped=1 runtime_own={pause} ended=1 grace_ran_out=0"
            assert not alive(pause)              # not waited for, but ended: see _end_runtime_own
        else:
            said = "launcher=python reaped=1 runtime_own=none ended=0 grace_ran_out=1"
        assert f"tether-run: after the runtime: {said}\n" in proc.stderr
        assert not alive(monitor)                # the monitor was waited for, and reaped
    finally:
        if (tmp_path / "pause").exists() and alive(int((tmp_path / "pause").read_text())):
            os.kill(int((tmp_path / "pause").read_text()), signal.SIGKILL)


def test_a_pause_process_its_podman_killed_is_not_a_process_of_the_rank_killed(tmp_path):
    """On a cold node the ranks' podmans race to make the pause process; the losers kill theirs,
    which the launcher (a child subreaper) reaps: not a killed process of the rank's, which would
    have stopped the retry of a podman that failed before it made the container."""
    code = textwrap.dedent("""\
        import ctypes, os, time
        from tether.container.launch import _set_subreaper, _wait_for
        from tether.container.runtimes.podman import PAUSE_NAMES
        _set_subreaper()
        child = os.fork()
        if child == 0:                         # 'podman'
            middle = os.fork()
            if middle == 0:                    # which makes the pause process
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:                   # forked from podman: named podman until it execs
                    ctypes.CDLL(None).prctl(15, b"podman", 0, 0, 0)
                    os.write(w, b"x")
                    time.sleep(600)
                os.read(r, 1)
                os.kill(pid, 9)                # lost the race: killed, left to the subreaper
                os._exit(1)
            os.waitpid(middle, 0)
            time.sleep(0.2)                    # podman goes on: the killed one is reaped first
            os._exit(3)
        status, killed = _wait_for(child, set(PAUSE_NAMES))
        print(os.WEXITSTATUS(status), killed)
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "3 []\n", proc.stderr


def test_podmans_launch_names_its_pause_process_in_its_run_directory(tmp_path):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    run = tmp_path / "run"
    launch = adapter("podman", {"env": {"XDG_RUNTIME_DIR": str(run)}}).launch(
        spec(image=str(rootfs), runtime="podman"), {**HOST, "XDG_RUNTIME_DIR": "/run/user/1000"})
    assert launch.runtime_own == ((f"{run}/libpod/tmp/pause.pid", ("catatonit", "podman pause", "podman")),)


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.mark.skipif(os.geteuid() != 0 or not FREEZER.is_dir(), reason="needs root and the cgroup v1 freezer")
def test_in_a_slurm_step_signals_go_only_where_slurm_does_not_reach(tmp_path):
    """In a step's freezer cgroup (Slurm's proctrack/cgroup signals every process in it), the
    launcher signals the runtime and the processes a runtime moved into a cgroup of its own -- not
    those Slurm signals itself, which would otherwise get every signal twice."""
    step = FREEZER / f"tether-unit-{os.getpid()}" / "job_1" / "step_0"
    own = step / "runc-like"
    own.mkdir(parents=True)
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( sleep 30 & echo $! > {tmp_path}/kept.pid ) & )
        ( ( sleep 31 & echo $! > {tmp_path}/moved.pid ) & )
        trap 'exit 7' TERM
        while :; do sleep 0.1; done
        """))
    runtime.chmod(0o755)
    kept = moved = None
    try:
        proc = subprocess.Popen(["sh", "-c", f'echo $$ > {step}/cgroup.procs && exec "$@"', "sh", sys.executable,
                                 "-c", _supervised(runtime, tmp_path / "cleaned")])
        deadline = time.monotonic() + 20
        while not ((tmp_path / "kept.pid").exists() and (tmp_path / "moved.pid").exists()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        kept, moved = int((tmp_path / "kept.pid").read_text()), int((tmp_path / "moved.pid").read_text())
        (own / "cgroup.procs").write_text(str(moved))             # what podman's runc does
        assert f"{step.relative_to(FREEZER)}" in Path(f"/proc/{kept}/cgroup").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7                         # the runtime got it
        assert not alive(moved)                                  # out of Slurm's reach: from the launcher
        assert alive(kept)                                       # Slurm's to signal: not twice
    finally:
        for pid in (kept, moved):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for path in (own, step, step.parent, step.parent.parent):
            while path.exists() and time.monotonic() < deadline:
                try:
                    path.rmdir()
                except OSError:
                    time.sleep(0.05)


def _supervised(runtime: Path, removed: Path, monitor: str | None = None, result: bool = True) -> str:
    """Python code that supervises ``runtime`` as the podman adapter's launches are, with a fake
    adapter whose removal writes the container's name into ``removed`` (and answers ``result``)."""
    return textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
            def remove(self, name, env, *, new_session=True, reap=False):
                open({str(removed)!r}, "w").write(name)
                return {result!r}
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=True, runtime=Fake({{}}),
                       container="c1", monitor={monitor!r}))
        """)


@pytest.mark.parametrize("code,removed", [(143, True), (125, True), (3, False), (0, False)])
def test_a_runtime_that_reports_a_killed_container_gets_it_removed(tmp_path, code, removed):
    """Regression (issue 12, soak): at a step's cancel podman run exited 143 before the launcher's own
    SIGTERM arrived, so nothing looked abnormal, the marker went, and conmon -- killed before it
    recorded the exit -- left the container "running" in podman's records."""
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\nexit {code}\n")
    runtime.chmod(0o755)
    marker = tmp_path / "removed"
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, marker, monitor="conmon")], timeout=60)
    assert proc.returncode == code and marker.exists() is removed


def test_a_supervised_runtime_starts_with_default_signals_and_a_missing_one_is_reported(tmp_path):
    """The launcher spawns the runtime (posix_spawn): the signals it forwards, and SIGPIPE, which
    Python ignores, are at their defaults in the runtime (an ignored SIGPIPE would be inherited by
    everything the runtime execs); a runtime that is not there gets tether's message and 125."""
    seen = tmp_path / "seen"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\ngrep -E '^Sig(Ign|Cgt)' /proc/$$/status > {seen}\n")
    runtime.chmod(0o755)
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, tmp_path / "removed")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    masks = dict(line.split(":\t") for line in seen.read_text().splitlines())
    assert int(masks["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)) == 0, masks
    assert int(masks["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)) == 0, masks
    proc = subprocess.run([sys.executable, "-c", _supervised(tmp_path / "no-such-runtime", tmp_path / "removed")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    assert f"tether: cannot start the container runtime '{tmp_path / 'no-such-runtime'}': No such file" in proc.stderr


def test_a_runtime_run_in_place_starts_with_default_signals(tmp_path):
    """Apptainer/Singularity: the launcher execs the runtime; SIGPIPE and SIGXFSZ, which Python
    ignores, are back at their defaults first (an ignored signal survives exec: ``yes | head``
    in the container would see EPIPE instead of dying of SIGPIPE)."""
    seen = tmp_path / "seen"
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\ngrep -E '^SigIgn' /proc/$$/status > {seen}\n")
    runtime.chmod(0o755)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=False))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ignored = int(seen.read_text().split(":\t")[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1)) == 0 and ignored & (1 << (signal.SIGXFSZ - 1)) == 0, hex(ignored)


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "No such file or directory (install it on this node, or set container.fake.binary"),
    (lambda p: p.write_text("#!/bin/sh\n"), "Permission denied (it is not a program you may run: check "
                                             "container.fake.binary"),
    ("e2big", "Argument list too long (its command line and environment, "),
])
@pytest.mark.parametrize("supervise", [False, True])
def test_a_runtime_that_cannot_start_is_reported_with_what_to_do(tmp_path, make, words, supervise):
    runtime = tmp_path / "runtime"
    env = "dict(os.environ)"
    if make == "e2big":
        runtime = Path("/bin/true")
        env = "{**os.environ, **{f'V{i}': 'x' * 100000 for i in range(40)}}"       # 4 MB > ARG_MAX
    else:
        make(runtime)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
        execute(Launch(argv=[{str(runtime)!r}], env={env}, supervise={supervise}, runtime=Fake({{}})))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    assert f"tether: cannot start the container runtime '{runtime}': {words}" in proc.stderr
    if make == "e2big":
        assert "bytes with " in proc.stderr and "variables, are more than the kernel takes" in proc.stderr


@pytest.mark.parametrize("created", [False, True])
def test_a_run_that_failed_before_creating_its_container_is_tried_again_after_repair(tmp_path, created):
    """A runtime whose own state was stale exits 1 before it creates the container (podman: no
    --cidfile written). The adapter repairs the state and the run is tried once more -- but a run
    that created its container (the user's command ran and exited 1) is never run twice."""
    runs, cid = tmp_path / "runs", tmp_path / "rank-0" / ".cid"     # the rank's own directory
    cid.parent.mkdir()
    runtime = tmp_path / "runtime.sh"
    write_cid = f"echo c1 > {cid}" if created else ":"
    runtime.write_text(f"#!/bin/sh\necho run >> {runs}\n[ -e {tmp_path}/repaired ] && exit 0\n{write_cid}\nexit 1\n")
    runtime.chmod(0o755)
    code = textwrap.dedent(f"""\
        import os
        from tether.container.launch import execute
        from tether.container.runtimes import Launch, Runtime
        class Fake(Runtime):
            name = "fake"
            def recover_state(self, env, output=None):
                open({str(tmp_path / "repaired")!r}, "w").close()
                return True
        execute(Launch(argv=[{str(runtime)!r}], env=dict(os.environ), supervise=True, runtime=Fake({{}}),
                       container="c1", monitor="conmon", created={str(cid)!r}))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if created:
        assert proc.returncode == 1 and runs.read_text() == "run\n" and not (tmp_path / "repaired").exists()
    else:
        assert proc.returncode == 0 and runs.read_text() == "run\nrun\n", proc.stderr
    assert not cid.exists()


@pytest.mark.parametrize("removal", [True, False])
def test_a_killed_monitor_is_reported_and_its_container_removed(tmp_path, removal):
    """Regression (issue 12): with podman's conmon killed, the rank said "podman could not start the
    container (exit 127)" for a container that had run, and the record stayed. The monitor here is a
    double-forked process named conmon; the 'runtime' exits 127 when it dies, as podman does. When
    the removal fails, the rank no longer says "it was removed" (it did, on podman 5)."""
    conmon = tmp_path / "conmon"
    conmon.symlink_to("/bin/sleep")
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        ( ( exec {conmon} 60 & echo $! > {tmp_path}/conmon.pid ) & )
        while [ ! -s {tmp_path}/conmon.pid ]; do sleep 0.05; done
        pid=$(cat {tmp_path}/conmon.pid)
        # killed once it is conmon and the launcher's, as podman's is (a busy machine: the subshell
        # may not have exec'd it yet, or may still be there to reap it)
        while read -r _ comm _ ppid _ < /proc/$pid/stat; [ "$comm $ppid" != "(conmon) $PPID" ]; do sleep 0.05; done
        kill -9 "$pid"
        sleep 1
        exit 127
        """))
    runtime.chmod(0o755)
    proc = subprocess.run([sys.executable, "-c", _supervised(runtime, tmp_path / "removed", "conmon", removal)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 125, proc.stderr
    # no marker here (run by hand): nothing removes it later, the rank says how to
    said = "it was removed" if removal else "remove it: runtime.sh rm --force c1"
    assert f"the container's conmon was killed (SIGKILL): the container's exit status is lost; {said}" in proc.stderr
    assert "could not start" not in proc.stderr and (tmp_path / "removed").read_text() == "c1"


def test_podman_gpu_ranks_need_a_cdi_spec_and_get_only_their_gpus(tmp_path, monkeypatch):
    """Issue 15: `--device nvidia.com/gpu=all` handed every GPU of the node to each rank and failed
    with "unresolvable CDI devices" on a node without a spec."""
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    settings = {"cdi_spec_dirs": [str(cdi), str(tmp_path / "absent")]}
    s = spec(image=str(rootfs), runtime="podman", gpus=("1", "3"))
    with pytest.raises(LaunchError, match=r"need a CDI spec for nvidia.com/gpu on this node .*nvidia-ctk cdi generate"):
        adapter("podman", settings).launch(s, HOST)
    (cdi / "other.json").write_text('{"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": []}')
    with pytest.raises(LaunchError, match="need a CDI spec"):
        adapter("podman", settings).launch(s, HOST)
    (cdi / "nvidia.json").write_text('{"cdiVersion": "0.5.0",\n "kind": "nvidia.com/gpu",\n "devices": []}')
    argv = adapter("podman", settings).launch(s, HOST).argv
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"] and "CUDA_VISIBLE_DEVICES=0,1" in argv
    cpu = adapter("podman", {"cdi_spec_dirs": []}).launch(spec(image=str(rootfs), runtime="podman",
                                                                gpus=("1",), slot_type="cpu"), HOST).argv
    assert "--device" not in cpu


@pytest.mark.parametrize("local,step,confined,expected", [
    (["1", "2"], "1,2", False, ["1", "2"]),      # the task has all of the step's GPUs
    (["2"], "1,2", False, ["2"]),                # bound to one, no device cgroup: ids are the node's
    (["1"], "1,2", True, ["2"]),                 # ConstrainDevices: local ids count over the step's
    (["0"], "2,3", False, ["2"]),                # 0 is not one of the step's: it counts over them
    (["0"], "", False, ["0"]),                   # no SLURM_STEP_GPUS (PBS, tether run): as given
])
def test_gpu_device_ids_follow_slurms_numbering(monkeypatch, local, step, confined, expected):
    from tether.container.runtimes import podman

    monkeypatch.setattr(podman, "_devices_confined", lambda: confined)
    assert podman.gpu_device_ids(local, {"SLURM_STEP_GPUS": step} if step else {}) == expected


def passed_fds(launch) -> dict[int, int]:
    """The fds a podman launch passes into the container (not the --env-file memfd, at 10 and up)."""
    return {k: v for k, v in (launch.fds or {}).items() if v < 10}


def env_file_names(launch) -> set[str]:
    """The names in a podman launch's --env-file (a memfd of this process)."""
    path = launch.argv[launch.argv.index("--env-file") + 1]
    return set(Path(path.replace("/dev/fd/", "/proc/self/fd/")).read_text().split())


def test_podman_passes_the_pmi2_socket_and_the_pmix_server_directory(tmp_path, monkeypatch):
    """Issue 15: `srun --mpi=pmi2` ranks found no PMI_FD socket in the container; PMIx clients no
    server directory."""
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    server = tmp_path / "pmix.42.0"
    server.mkdir()
    r, w = os.pipe()
    try:
        host = {**HOST, "PMI_FD": str(w), "PMIX_SERVER_TMPDIR": f"{server}/",
                "PMIX_DSTORE_21_BASE_PATH": f"{server}//pmix_dstor_ds21_7", "PMIX_NAMESPACE": "slurm.pmix.42.0"}
        launch = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), host)
    finally:
        os.close(r)
        os.close(w)
    argv = launch.argv
    assert passed_fds(launch) == {w: 3} and "--preserve-fds=1" in argv and "PMI_FD=3" in argv
    assert f"{server}:/run/tether/pmix" in argv and "PMIX_SERVER_TMPDIR=/run/tether/pmix/" in argv
    assert "PMIX_DSTORE_21_BASE_PATH=/run/tether/pmix//pmix_dstor_ds21_7" in argv
    names = env_file_names(launch)
    assert "PMIX_NAMESPACE" in names and not {"PMI_FD", "PMIX_SERVER_TMPDIR", "PMIX_DSTORE_21_BASE_PATH"} & names
    closed = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), {**HOST, "PMI_FD": "250"})
    assert passed_fds(closed) == {} and "--preserve-fds=1" not in closed.argv


@pytest.mark.parametrize("pmi_fd", ["9" * 30, "٣", "-3", "3 ", "", "0"])
def test_a_hostile_pmi_fd_is_ignored_not_a_crash(tmp_path, monkeypatch, pmi_fd):
    """PMI_FD is the job's to set: a huge number raised OverflowError in the launcher (a Python
    traceback for the rank); any value that is not a small open fd is simply not passed."""
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    launch = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), {**HOST, "PMI_FD": pmi_fd})
    assert passed_fds(launch) == {} and "--preserve-fds=1" not in launch.argv


@pytest.mark.parametrize("ids", [("0", "../../dev/sda"), ("GPU-1=x",), ("٣",), ("a" * 300,)])
def test_gpu_ids_that_are_not_device_names_are_refused(tmp_path, monkeypatch, ids):
    """The rank's GPU ids become CDI device names; the job can set CUDA_VISIBLE_DEVICES itself, so
    only index or UUID-like names are accepted (an error for the step, never an odd --device)."""
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "n.yaml").write_text("kind: nvidia.com/gpu\n")
    with pytest.raises(LaunchError, match="not a GPU index or UUID"):
        adapter("podman", {"cdi_spec_dirs": [str(cdi)]}).launch(
            spec(image=str(rootfs), runtime="podman", gpus=ids), HOST)


def test_a_fifo_among_cdi_specs_or_as_slurm_conf_does_not_hang(tmp_path):
    """Reading a FIFO blocks until a writer comes: only regular files are read."""
    from tether.container.runtimes.podman import pmix_client_dir, spec_has_kind

    cdi = tmp_path / "cdi"
    cdi.mkdir()
    os.mkfifo(cdi / "a.yaml")
    (cdi / "b.yaml").write_text("kind: nvidia.com/gpu\n")
    assert spec_has_kind(str(cdi), "nvidia.com/gpu")
    os.mkfifo(tmp_path / "slurm.conf")
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert pmix_client_dir(env) is None


def test_the_pmix_client_directory_is_found_where_slurm_makes_it(tmp_path):
    """Slurm's PMIx plugin makes <base>/spmix_appdir_<uid>_<job>.<step>: base SLURM_PMIX_TMPDIR, else
    TmpFS (with %n), else /tmp; Open MPI learns it through PMIx, so it is mounted at its own path."""
    from tether.container.runtimes.podman import pmix_client_dir

    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=x\n  tmpfs = {tmp_path}/tmpfs/%n  # per node\n")
    client = tmp_path / "tmpfs" / "n2" / f"spmix_appdir_{os.getuid()}_42.0"
    client.mkdir(parents=True)
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_CONF": str(conf), "SLURMD_NODENAME": "n2"}
    assert pmix_client_dir(env) == str(client)
    assert pmix_client_dir({**env, "SLURM_STEP_ID": "1"}) is None                # not made: nothing to mount
    own = tmp_path / "own" / "spmix_appdir_42.0"
    own.mkdir(parents=True)
    assert pmix_client_dir({**env, "SLURM_PMIX_TMPDIR": str(tmp_path / "own")}) == str(own)
    assert pmix_client_dir({**env, "SLURM_JOB_ID": "../x"}) is None


def test_podman_names_what_a_shared_rootfs_lacks(tmp_path):
    from tether.container.runtimes.podman import missing_targets

    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "mnt").mkdir()
    (rootfs / "etc" / "passwd").write_text("")
    assert missing_targets(str(rootfs)) == ["/etc/group", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf",
                                            "/etc/mtab", "/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp"]
    mounts = parse_mounts("/a:/mnt,/b:/tmp/x,/c:/data")
    assert missing_targets(str(rootfs), mounts)[-1:] == ["/data"]     # /mnt exists, /tmp/x is on a tmpfs


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a root-owned image and drop to nobody")
def test_podman_imports_a_shared_rootfs_that_cannot_run_as_it_is():
    """A shared (root-owned) rootfs runs as it is only read-only and complete; without podman's
    mount targets, with a mount onto a target it lacks, or writable, it is imported into the
    user's store first (one step, under the store's lock) and run from there."""
    import shutil
    import tempfile

    from tether.container.runtimes.podman import Podman

    base = tempfile.mkdtemp(dir="/var/tmp")
    try:
        os.chmod(base, 0o755)
        full = os.path.join(base, "full")
        for target in ("etc/passwd", "etc/group", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab"):
            os.makedirs(os.path.join(full, os.path.dirname(target)), exist_ok=True)
            open(os.path.join(full, target), "w").close()
        for target in ("proc", "sys", "dev", "run", "tmp", "var/tmp", "mnt"):
            os.makedirs(os.path.join(full, target))
        bare = os.path.join(base, "bare")
        os.makedirs(os.path.join(bare, "bin"))
        for root, dirs, _ in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        store = os.path.join(base, "store-{uid}")
        os.makedirs(f"{base}/xdg", mode=0o700)
        os.chown(f"{base}/xdg", 65534, 65534)
        os.chmod(base, 0o1777)

        def plan(image, writable=False, mounts=""):
            def call():
                adapter = Podman({"store": store, "env": {"XDG_RUNTIME_DIR": f"{base}/xdg"}})
                spec = type("Spec", (), {"image": image, "writable": writable, "mounts": parse_mounts(mounts)})()
                argv, before = adapter.image_plan(spec, adapter.global_args({}, create=True))
                return argv, [(step[1][1], step[2]) for step in before]     # (quick look, argv): the argv
            return _as_user(65534, call)

        assert plan(full) == (["--rootfs", full], [])                       # as it is: nothing copied
        assert plan(full, mounts="/etc:/mnt")[1] == []
        for image, writable, mounts, why in ((bare, False, "", "no /etc/passwd, /etc/group, /etc/hosts in it"),
                                             (full, False, "/etc:/data", "no /data in it"),
                                             (full, True, "", "--container-writable")):
            argv, before = plan(image, writable, mounts)
            assert argv[0] == "--pull=never" and argv[1].startswith("localhost/tether-rootfs:")
            (check, label), = before
            assert check[-3:] == ["image", "exists", argv[1]] and f"--root {base}/store-65534/storage" in " ".join(check)
            assert label == f"importing the rootfs {image} into your podman store on this node ({why})"
        assert plan(bare)[0] != plan(full, True)[0]                            # one image per directory
        assert os.stat(os.path.join(base, "store-65534")).st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(base)


def test_a_podman_store_another_user_could_change_is_refused(tmp_path):
    from tether.container.runtimes.podman import store_directory

    base = tmp_path / "base"
    base.mkdir()
    uid = os.getuid()
    made = store_directory(f"{base}/s-{{uid}}/podman", uid)
    assert made == f"{base}/s-{uid}/podman" and os.stat(made).st_mode & 0o777 == 0o700
    os.chmod(made, 0o755)
    store_directory(f"{base}/s-{{uid}}/podman", uid)                 # the user's own: made private again
    assert os.stat(made).st_mode & 0o777 == 0o700
    (base / f"l-{uid}").symlink_to(base / f"s-{uid}")                # planted: a symlink
    with pytest.raises(LaunchError, match="is not a directory of yours"):
        store_directory(f"{base}/l-{{uid}}/podman", uid)
    assert store_directory("", uid) is None                          # podman's own default store
    if uid == 0:                                                     # another user's directory
        other = base / "o-0"
        other.mkdir()
        os.chown(other, 65534, 65534)
        with pytest.raises(LaunchError, match="is not a directory of yours"):
            store_directory(f"{base}/o-{{uid}}", 0)


# ---- the subprocess boundary, with pytest-subprocess (unregistered commands fail the test) ------
def test_enroot_preparation_runs_exactly_import_then_create(fp, tmp_path):
    from tether.container.launch import run_before

    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    s = spec(image="docker://ghcr.io/org/app:2", runtime="enroot", rank_dir=str(rank_dir))
    launch = adapter("enroot", {"binary": "/opt/enroot/bin/enroot"}).launch(s, HOST)
    sqsh = f"{tmp_path}/enroot-store-{os.getuid()}/{image_key(enroot_uri(s.image))[:24]}.sqsh"  # one file per image
    partial = f"{sqsh[:-5]}.{os.getpid()}.partial"
    fp.register(["/opt/enroot/bin/enroot", "import", "--output", partial, "docker://ghcr.io#org/app:2"],
                callback=lambda process: Path(partial).write_text("sqsh"))
    fp.register(["/opt/enroot/bin/enroot", "create", "--name", "tether-42-0-3", sqsh])
    run_before(launch)
    assert fp.call_count(["/opt/enroot/bin/enroot", "import", fp.any()]) == 1
    assert fp.call_count(["/opt/enroot/bin/enroot", "create", fp.any()]) == 1
    fp.register(["/opt/enroot/bin/enroot", "create", "--name", "tether-42-1-3", sqsh])
    run_before(adapter("enroot", {"binary": "/opt/enroot/bin/enroot"}).launch(
        spec(image="docker://ghcr.io/org/app:2", runtime="enroot", rank_dir=str(tmp_path / "42/n2/step-1/rank-3"),
             step_id="1"), HOST))
    assert fp.call_count(["/opt/enroot/bin/enroot", "import", fp.any()]) == 1    # the next step: no import
    enroot = adapter("enroot", {"binary": "/opt/enroot/bin/enroot"})
    (image,) = enroot.stored({})
    assert (image.name, image.where, image.size) == ("docker://ghcr.io#org/app:2", sqsh, 4)
    with pytest.raises(LaunchError, match="give a number of days >= 0"):
        enroot.prune(float("nan"), {})
    Path(sqsh[:-5] + ".99.partial").write_text("half")                       # an import killed midway
    assert enroot.prune(1, {}) == [sqsh[:-5] + ".99.partial"]                # used just now: kept
    os.utime(sqsh, (time.time() - 2 * 86400,) * 2)
    assert enroot.prune(1, {}) == [sqsh] and enroot.stored({}) == []


def test_enroot_import_failure_is_reported_with_its_message(fp, tmp_path):
    from tether.container.launch import run_before

    s = spec(image="docker://nope", runtime="enroot", rank_dir=str(tmp_path / "1/n1/step-0/rank-0"))
    launch = adapter("enroot", {}).launch(s, HOST)
    fp.register(["enroot", "import", fp.any()], returncode=1, stderr="[ERROR] URL https://registry-1.docker.io "
                                                                      "returned error code: 401 Unauthorized")
    with pytest.raises(LaunchError, match="401 Unauthorized"):
        run_before(launch)


def test_apptainer_conversion_is_one_exact_build(fp, tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    key = image_key("docker://python:3.12")

    def build(process):
        Path(process.args[-2]).write_text("SIF")

    fp.register(["/usr/bin/apptainer", "build", "--disable-cache", fp.any(min=1, max=1), "docker://python:3.12"],
                callback=build)
    path = ImageCache(str(root)).ensure("docker://python:3.12",
                                        build=["/usr/bin/apptainer", "build", "--disable-cache"])
    assert path == str(root / f"{key}.sif") and Path(path).read_text() == "SIF"
    assert ImageCache(str(root)).ensure("docker://python:3.12", build=["/usr/bin/apptainer", "build"]) == path
    assert fp.call_count(["/usr/bin/apptainer", "build", fp.any()]) == 1          # the second use: cached


# ---- image references (tether.hooks.imageref) ------------------------------------------------------
@pytest.mark.parametrize("text,docker,enroot", [
    ("ubuntu:22.04", "docker://docker.io/library/ubuntu:22.04", "docker://ubuntu:22.04"),
    ("ubuntu", "docker://docker.io/library/ubuntu:latest", "docker://ubuntu"),
    ("docker://busybox", "docker://docker.io/library/busybox:latest", "docker://busybox"),
    ("nvcr.io#nvidia/pytorch:24.01-py3", "docker://nvcr.io/nvidia/pytorch:24.01-py3",
     "docker://nvcr.io#nvidia/pytorch:24.01-py3"),
    ("alice@nvcr.io#nvidia/pytorch", "docker://nvcr.io/nvidia/pytorch:latest", "docker://alice@nvcr.io#nvidia/pytorch"),
    ("127.0.0.1:5000/team/app:1.0", "docker://127.0.0.1:5000/team/app:1.0", "docker://127.0.0.1:5000#team/app:1.0"),
    ("docker://localhost:5000/a/b", "docker://localhost:5000/a/b:latest", "docker://localhost:5000#a/b"),
    ("team/app@sha256:" + "a" * 64, "docker://docker.io/team/app@sha256:" + "a" * 64,
     "docker://team/app@sha256:" + "a" * 64),
])
def test_one_image_has_one_spelling_per_runtime(text, docker, enroot):
    from tether.hooks.imageref import parse_image

    ref = parse_image(text)
    assert ref.remote and ref.docker_uri() == docker and ref.enroot_uri() == enroot


@pytest.mark.parametrize("text,hint", [("img.sif", "absolute path"), ("./x.sqsh", "absolute path"),
                                       ("Ubuntu:22.04", "lowercase"), ("a b", "")])
def test_a_bad_image_is_refused_at_submit_naming_the_accepted_forms(text, hint):
    """Issue 14: `--container-image=ubuntu:22.04` was refused (and only on the node); a bad one is
    now refused wherever it is given, with the forms tether accepts."""
    with pytest.raises(LaunchError) as info:
        check_container_options({"container-image": text}, "podman")
    assert "expected an absolute path" in str(info.value) and "ubuntu:22.04" in str(info.value)
    assert hint in str(info.value)
    check_container_options({"container-image": "ubuntu:22.04"}, "podman")      # accepted
    check_container_options({"container-image": "nvcr.io#nvidia/pytorch:24.01-py3"}, "enroot")


def test_podman_pulls_a_registry_image_once_per_node_before_running_it(tmp_path):
    s = spec(image="127.0.0.1:5000/team/app:1", runtime="podman", rank_dir=str(tmp_path / "42/n2/step-0/rank-3"))
    launch = adapter("podman", {"args": ["--runtime", "runc"]}).launch(s, HOST)
    name = "127.0.0.1:5000/team/app:1"
    store = launch.argv[4:8]
    assert store[:2] == ["--root", f"{tmp_path}/podman-store-{os.getuid()}/storage"]
    ((pull, (quick, exists), label),) = launch.before
    assert pull == ["podman", "--runtime", "runc", *store, "pull", "--quiet", name]
    assert exists == ["podman", "--runtime", "runc", *store, "image", "exists", name]
    assert label == "pulling 127.0.0.1:5000/team/app:1 (podman)"
    assert quick() is False                             # not in the store's index: podman decides
    index = tmp_path / f"podman-store-{os.getuid()}/storage/vfs-images"
    index.mkdir(parents=True)
    (index / "images.json").write_text(json.dumps([{"id": "ab", "names": [name]}], separators=(",", ":")))   # compact, as Go writes it
    assert quick() is True                              # listed there: no podman process at all
    # the user's ranks and jobs on this node share the store's lock
    assert launch.lock == f"{tmp_path}/podman-store-{os.getuid()}/.pull-lock"
    assert launch.argv[-4:-2] == ["--pull=never", name]
    own = adapter("podman", {"args": ["--runtime", "runc"], "store": ""}).launch(s, HOST)   # podman's default
    assert own.before[0][0] == ["podman", "--runtime", "runc", "pull", "--quiet", name]
    assert own.lock == str(tmp_path / "42/n2/podman/.pull-lock")        # the node's ranks of this job


def test_ranks_of_a_node_wait_for_one_pull_and_say_so(tmp_path):
    """The first rank pulls (saying so and how long it took); the others wait on the node's lock,
    say that they wait, and then find the image there."""
    marker, pulls = tmp_path / "present", tmp_path / "pulls"
    script = textwrap.dedent(f"""\
        import sys
        from tether.container.launch import run_before
        from tether.container.runtimes import Launch
        run_before(Launch(argv=["true"], env={{"PATH": "/usr/bin:/bin"}}, lock={str(tmp_path / 'node/.lock')!r},
                          before=[(["sh", "-c", "echo x >> {pulls}; sleep 3; touch {marker}"],
                                   ["test", "-e", {str(marker)!r}], "pulling img (podman)")]))
        """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert pulls.read_text() == "x\n"                                  # one pull
    text = "".join(errs)
    assert text.count("tether: pulling img (podman) ...") == 1 and "pulling img (podman): done in" in text
    assert text.count("tether: waiting for another rank on this node: pulling img (podman)") == 2


def test_enroot_leaves_out_only_values_its_environment_file_would_change(tmp_path, fake_runtimes, runtime_config):
    """enroot's environment file is one NAME=VALUE per line, and common::envfmt strips quotes around
    a whole value (twice): those values are left out and named; everything else arrives exactly
    (checked through the fake, which sources the --conf script with bash and applies envfmt)."""
    from tether.container.runtimes.enroot import carried

    assert [carried(v) for v in ("plain", "it's", "a\"b'", "'x'", '"x"  ', "x\ny", "x\r", "")] == [
        True, True, True, False, False, False, False, True]
    values = {"Q1": "'quoted'", "NL": "a\nb", "OK1": "$(id) `id` ${HOME} \\ '", "NL2": "EOF\nTETHER",
              "OK3": "TETHER_END_OF_ENVIRONMENT", "OK4": "=a=b=", "OK5": ""}
    fake_runtimes.configure(exit_code=0)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true", **values)
    assert proc.returncode == 0, proc.stderr
    assert "not passed into the enroot container: NL, NL2, Q1 (a line break, or quotes" in proc.stderr
    (started,) = fake_runtimes.calls("enroot-container")
    inside = started["container_env"]
    for name in ("OK1", "OK3", "OK4", "OK5"):
        assert inside[name] == values[name], name
    assert not {"Q1", "NL", "NL2"} & set(inside)


def test_podman_as_root_in_a_slurm_cgroup_is_refused_not_silently_loose(tmp_path, monkeypatch):
    """Issue 16: as root, podman moves the container to /libpod_parent, out of the step's cgroup."""
    from tether.container.runtimes import podman

    assert podman.in_slurm_cgroup("6:freezer:/slurm_n1/uid_0/job_5/step_0\n4:memory:/slurm_n1/uid_0/job_5/step_0/task_0\n")
    assert podman.in_slurm_cgroup("4:memory:/slurm/uid_0/job_5/step_0/task_0\n")
    assert not podman.in_slurm_cgroup("6:freezer:/\n4:memory:/process_api/abc\n0::/\n")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    monkeypatch.setattr(podman.os, "getuid", lambda: 0)
    monkeypatch.setattr(podman, "in_slurm_cgroup", lambda: True)
    with pytest.raises(LaunchError, match="podman as root moves the container into a cgroup of its own"):
        adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), HOST)
    monkeypatch.setattr(podman, "in_slurm_cgroup", lambda: False)      # process-tree tracking: fine
    assert adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), HOST).argv[:2] == ["podman", "run"]


def test_enroot_environment_script_is_never_written_through_a_planted_symlink(tmp_path):
    """The step's directory is the user's: a symlink where the script belongs is refused with a
    clear launch error (exit 125), never followed."""
    from tether.container.runtimes.enroot import write_environ_conf

    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "enroot").mkdir()
    (tmp_path / "enroot" / "environ-0.conf").symlink_to(target)
    with pytest.raises(LaunchError, match="cannot write enroot's environment script"):
        write_environ_conf(str(tmp_path / "enroot" / "environ-0.conf"), {"A": "1"})
    assert target.read_text() == "keep"


def _fake_podman(tmp_path: Path, *, stale: bool, migrate_heals: bool = True, second: bool = False) -> Path:
    """A podman that answers ``container exists`` as 4.3 does with a stale run state (the message,
    exit 1) or a sound one (exit 1, no such container), and records ``system migrate`` (which
    heals the state, or only on its second call: ``second``)."""
    state = tmp_path / "stale"
    if stale:
        state.write_text("")
    heal = f"rm -f {state}"
    if second:
        heal = f"if [ -e {tmp_path}/migrated ]; then rm -f {state}; fi; touch {tmp_path}/migrated"
    script = tmp_path / "podman"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {tmp_path}/calls
        case "$*" in
          *"system migrate"*) {heal if migrate_heals else 'true'}; exit 0 ;;
          *"container exists"*)
            if [ -e {state} ]; then
              echo 'Error: invalid internal status, try resetting the pause process with "podman system migrate"' >&2
            fi
            exit 1 ;;
        esac
        exit 1
        """))
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("stale,heals,second,expected,said,migrations", [
    (True, True, False, True, "run state on this node is stale", 1),       # repaired: one more try
    (True, True, True, True, "run state on this node is stale", 2),        # healed by the second pass
    (True, False, False, False, "still stale after `podman system migrate` twice", 2),
    (False, True, False, True, "its state checks out now: trying once more", 0),   # exit 1 without a word
])
def test_podman_after_a_run_that_never_created_the_container(tmp_path, capsys, stale, heals, second, expected,
                                                             said, migrations):
    from tether.container.runtimes.podman import Podman

    podman = Podman({"binary": str(_fake_podman(tmp_path, stale=stale, migrate_heals=heals, second=second))})
    assert podman.recover_state(dict(os.environ)) is expected
    assert said in capsys.readouterr().err
    assert (tmp_path / "calls").read_text().count("system migrate") == migrations


def test_podman_a_failed_command_whose_output_says_nothing_stale_is_not_retried(tmp_path, capsys):
    from tether.container.runtimes.podman import Podman

    podman = Podman({"binary": str(_fake_podman(tmp_path, stale=False))})
    assert podman.recover_state(dict(os.environ), "Error: no such image") is False
    assert capsys.readouterr().err == ""


def _podman5(tmp_path: Path) -> tuple[Path, Path]:
    """A podman that behaves as podman 5 did on a cold node here (Slurm 24.11's root): its state
    names a container whose conmon died with the step, so every command says the state is stale
    and ``system migrate`` does not help (it fails to unmount the container's /dev/shm outside the
    user namespace); without its boot marker (``$XDG_RUNTIME_DIR/libpod/tmp/alive``) the next
    command starts afresh, as after a reboot, and writes the marker again. ``rm`` then removes.
    Returns the podman and the run directory."""
    run = tmp_path / "run"
    (run / "libpod" / "tmp").mkdir(parents=True)
    (run / "libpod" / "tmp" / "alive").write_text("")
    (tmp_path / "stale").write_text("")
    (tmp_path / "record").write_text("")
    script = tmp_path / "podman"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {tmp_path}/calls
        alive="$XDG_RUNTIME_DIR/libpod/tmp/alive"
        if [ ! -e "$alive" ]; then rm -f {tmp_path}/stale; : > "$alive"; fi
        if [ -e {tmp_path}/stale ]; then
          case "$*" in *"system migrate"*)
            echo 'Error: unmounting container shm: operation not permitted' >&2; exit 125 ;; esac
          echo 'Error: invalid internal status, try resetting the pause process with "podman system migrate": could not find any running process: no such process' >&2
          exit 1
        fi
        case "$1 $2" in
          "rm "*) rm -f {tmp_path}/record; exit 0 ;;
          "container exists") [ -e {tmp_path}/record ] && [ "${{*##* }}" = c1 ] && exit 0; exit 1 ;;
          "inspect "*) echo 0123abcd; exit 0 ;;
        esac
        exit 0
        """))
    script.chmod(0o755)
    return script, run


def test_podman_5_state_that_migrate_cannot_repair_starts_afresh_as_after_a_reboot(tmp_path, capsys):
    """Issue 46 (cold nodes on podman 5): a container's record whose conmon died with its step left
    every podman command of the user failing, and `system migrate` could not repair it. The boot
    marker removed, podman starts afresh; the repair says so. Before: False, the state stale."""
    from tether.container.runtimes.podman import Podman

    binary, run = _podman5(tmp_path)
    podman = Podman({"binary": str(binary), "env": {"XDG_RUNTIME_DIR": str(run)}})
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run)}
    assert podman.recover_state(env) is True
    assert (run / "tether-podman-repair.lock").exists()           # the repair held the user's lock
    err = capsys.readouterr().err
    assert "starting it afresh, as after a reboot" in err and "migrate` twice" not in err, err
    assert (run / "libpod" / "tmp" / "alive").exists()          # podman made it again
    assert (tmp_path / "calls").read_text().count("system migrate") == 1


def test_a_repair_asks_podman_again_under_the_lock_before_any_remedy(tmp_path, capsys):
    """Another rank (or the step's cleanup) repaired the state while this one waited for the
    user's repair lock, and started containers: a `system migrate` now would stop them, a reset
    would make podman forget them. Before: the stale answer from before the lock was acted on."""
    from tether.container.runtimes.podman import STALE_STATE, repair_stale_state

    script = tmp_path / "podman"
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\nexit 1\n")   # healthy: no such container
    script.chmod(0o755)
    lock = tmp_path / "repair.lock"
    assert repair_stale_state([str(script)], output=f"Error: {STALE_STATE} ...", lock=str(lock),
                              reset=lambda: (tmp_path / "reset").write_text("")) is True
    calls = (tmp_path / "calls").read_text()
    assert "system migrate" not in calls and "container exists" in calls and not (tmp_path / "reset").exists()
    assert lock.exists()


def test_podman_removal_after_a_cold_step_end_repairs_the_state_first(tmp_path, capsys):
    """The cleanup after a step whose end killed conmon and the pause process (a time limit on a
    cold node): `rm` met the stale state, and `container exists` -- exit 1 there too -- read as
    "removed", so the record stayed while the removal said done. Now the state is repaired and the
    container removed; a stale answer never counts as gone."""
    from tether.container.runtimes.podman import Podman

    binary, run = _podman5(tmp_path)
    podman = Podman({"binary": str(binary), "env": {"XDG_RUNTIME_DIR": str(run)}})
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run)}
    assert podman.remove("c1", env) is True
    assert not (tmp_path / "record").exists()


def test_a_command_waited_for_with_a_callback_loses_no_output_and_keeps_its_bound():
    """run_command(while_waiting=): the callback runs with the command's pid while it runs; the
    output and exit status arrive whole; the timeout still holds."""
    from tether.system.proc import CommandError, run_command

    seen = []
    done = run_command(["sh", "-c", "sleep 0.35; echo out; echo err >&2; exit 3"], check=False,
                       while_waiting=seen.append, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert seen and len(set(seen)) == 1
    with pytest.raises(CommandError, match="timed out after 0.3 s"):
        run_command(["sleep", "5"], timeout=0.3, while_waiting=lambda pid: None)


def test_podman_removal_reaps_the_killed_containers_processes_it_waits_for(tmp_path):
    """Podman 5 with a killed conmon: the container's processes are the launcher's children, and
    `rm`'s SIGKILL leaves them zombies until the launcher reaps them -- rm then fails "given PID did
    not die within timeout" on every try (seen on Slurm 24.11's root), and the container stayed for
    the step's end. The stand-in fails as long as the zombie's /proc entry is there."""
    from tether.container.runtimes.podman import Podman

    pid = os.fork()
    if pid == 0:
        os._exit(0)                                   # a zombie until reaped
    (tmp_path / "record").write_text("")
    script = tmp_path / "podman"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1 $2" in
          "rm "*) for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do   # podman waits for it
                    [ -e /proc/{pid} ] || break; sleep 0.1
                  done
                  if [ -e /proc/{pid} ]; then
                    echo 'Error: cannot remove container 0123 as it could not be stopped: given PID did not die within timeout' >&2
                    exit 125
                  fi
                  rm -f {tmp_path}/record; exit 0 ;;
          "container exists") [ -e {tmp_path}/record ] && exit 0; exit 1 ;;
          "inspect "*) echo 0123abcd; exit 0 ;;
        esac
        exit 0
        """))
    script.chmod(0o755)
    try:
        assert Podman({"binary": str(script)}).remove("c1", dict(os.environ), reap=True) is True
        assert not (tmp_path / "record").exists()
    finally:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def test_container_mount_home_on_off_or_the_runtimes_own_default(tmp_path):
    """Issue 15 (pyxis parity): --container-mount-home / --no-container-mount-home; neither: each
    runtime's own default (Apptainer/Singularity mount home, podman does not, enroot per its
    config). Both at once are refused, at submit too."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**HOST, "TETHER_CONTAINER_IMAGE": str(tmp_path), "HOME": str(home)}
    assert spec_from_env(env, ["true"], default_runtime="podman").mount_home is None
    on = spec_from_env({**env, "TETHER_CONTAINER_MOUNT_HOME": "1"}, ["true"], default_runtime="podman")
    off = spec_from_env({**env, "TETHER_NO_CONTAINER_MOUNT_HOME": "1"}, ["true"], default_runtime="podman")
    assert (on.mount_home, off.mount_home) == (True, False)
    with pytest.raises(LaunchError, match="ask for opposite things"):
        spec_from_env({**env, "TETHER_CONTAINER_MOUNT_HOME": "1", "TETHER_NO_CONTAINER_MOUNT_HOME": "1"}, ["true"],
                      default_runtime="podman")
    with pytest.raises(LaunchError, match="ask for opposite things"):
        check_container_options({"container-image": "/i", "container-mount-home": "1",
                                 "no-container-mount-home": "1"}, "podman")
    with pytest.raises(LaunchError, match="need --container-image"):
        check_container_options({"no-container-mount-home": "1"}, "podman")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    host = {**HOST, "HOME": str(home)}
    podman = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True), host).argv
    assert ["--volume", f"{home}:{home}"] in [podman[i:i + 2] for i in range(len(podman))]
    plain = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman"), host).argv
    assert f"{home}:{home}" not in plain
    with pytest.raises(LaunchError, match="is not a directory to mount"):
        adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", mount_home=True),
                                     {**HOST, "HOME": str(tmp_path / "nope")})
    sif = tmp_path / "img.sif"
    sif.write_text("")
    assert "--no-home" in adapter("apptainer", {}).launch(spec(image=str(sif), mount_home=False), host).argv
    assert "--no-home" not in adapter("apptainer", {}).launch(spec(image=str(sif), mount_home=True), host).argv
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_text("")
    for value, expected in ((True, "y"), (False, "n"), (None, None)):
        launch = adapter("enroot", {}).launch(spec(image=str(sqsh), runtime="enroot", mount_home=value), host)
        assert launch.env.get("ENROOT_MOUNT_HOME") == expected


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a file the importing user cannot read")
def test_a_rootfs_import_counts_the_files_the_user_cannot_read(capfd):
    """tar as the user leaves out what the user could not read in the container either, and says
    how many (its own summary line is not one of them)."""
    import shutil
    import tempfile

    from tether.container.runtimes.podman import import_rootfs

    base = tempfile.mkdtemp(dir="/var/tmp")
    try:
        os.chmod(base, 0o755)
        (Path(base) / "bin").mkdir(mode=0o755)
        (Path(base) / "bin" / "tool").write_text("x")
        (Path(base) / "secret").write_text("s")
        os.chmod(Path(base) / "secret", 0o600)
        sink = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]     # podman import, reading it all
        assert _as_user(65534, lambda: import_rootfs(base, sink, "localhost/x:1")) is None
        err = capfd.readouterr().err
        assert "tether: 1 file(s) of " in err and "./secret: Cannot open: Permission denied" in err, err
    finally:
        shutil.rmtree(base)


def test_a_fifo_as_an_image_use_marker_does_not_hang_the_rank(tmp_path):
    """The store is the user's own, but a FIFO where tether records an image's last use must not
    hang a rank (an O_WRONLY open of a FIFO without a reader blocks)."""
    from tether.container.runtimes.podman import Podman

    podman = Podman({"store": str(tmp_path / "s-{uid}")})
    marker = podman._use_marker("localhost/x:1")
    os.makedirs(os.path.dirname(marker))
    os.mkfifo(marker)
    signal.alarm(10)
    try:
        podman.mark_used("localhost/x:1")          # returns: nothing recorded, nothing hung
    finally:
        signal.alarm(0)
    assert podman.last_use("localhost/x:1") is None


# ---- pyxis parity: remap-root, entrypoint, mount flags, save, the batch script, admin defaults (issue 15)
def test_mount_flags_are_joined_with_plus_as_pyxis_writes_them():
    (m,) = parse_mounts("/a:/b:ro+nosuid+rprivate")
    assert m == Mount("/a", "/b", True, ("nosuid", "rprivate")) and str(m) == "/a:/b:ro,nosuid,rprivate"
    assert str(parse_mounts("/a:/b:rw+nodev")[0]) == "/a:/b:nodev"
    for bad, why in (("/a:/b:ro+rw", "both ro and rw"), ("/a:/b:nosuid+suid", "both nosuid and suid"),
                     ("/a:/b:private+unbindable", "give one propagation"), ("/a:/b:x-create=link", "unknown flag")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


def test_on_off_pairs_and_the_admins_defaults():
    env = {"TETHER_CONTAINER_IMAGE": "/i"}
    plain = spec_from_env(env, ["true"], default_runtime="podman")
    assert (plain.remap_root, plain.entrypoint, plain.mount_home, plain.save) == (None, False, None, None)
    admin = {"entrypoint": True, "remap_root": True, "mount_home": False, "mounts": ["/scratch", "/etc/x:/etc/x:ro"]}
    site = spec_from_env({**env, "TETHER_CONTAINER_MOUNTS": "/mine:/etc/x"}, ["true"], default_runtime="podman",
                         defaults=admin)
    assert (site.remap_root, site.entrypoint, site.mount_home) == (True, True, False)
    # the admin's mounts first, the user's mount onto the same target replaces the admin's
    assert site.mounts == (Mount("/scratch", "/scratch"), Mount("/mine", "/etc/x"))
    mine = spec_from_env({**env, "TETHER_NO_CONTAINER_REMAP_ROOT": "1", "TETHER_NO_CONTAINER_ENTRYPOINT": "yes"},
                         ["true"], default_runtime="podman", defaults=admin)
    assert (mine.remap_root, mine.entrypoint) == (False, False)      # the user's choice wins
    for name in ("remap-root", "entrypoint"):
        key = name.upper().replace("-", "_")
        with pytest.raises(LaunchError, match=f"--container-{name} and --no-container-{name} ask for opposite"):
            spec_from_env({**env, f"TETHER_CONTAINER_{key}": "1", f"TETHER_NO_CONTAINER_{key}": "1"}, ["true"],
                          default_runtime="podman")
    assert spec_from_env({**env, "TETHER_CONTAINER_ENTRYPOINT_LOG": "1"}, ["t"], default_runtime="podman").entrypoint \
        is False                                                      # accepted, changes nothing


def test_container_save_is_per_node_relative_to_the_working_directory_and_refused_where_nothing_is_kept(tmp_path,
                                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_SAVE": "saved/c.tar"}
    assert spec_from_env({**env, "LOCAL_RANK": "0"}, ["t"], default_runtime="podman").save == f"{tmp_path}/saved/c.tar"
    assert spec_from_env({**env, "LOCAL_RANK": "1"}, ["t"], default_runtime="podman").save is None   # one per node
    with pytest.raises(LaunchError, match="a file's path, not a directory"):
        spec_from_env({**env, "TETHER_CONTAINER_SAVE": "out/"}, ["t"], default_runtime="podman")
    check_container_options({"container-image": "/i", "container-save": "/x.tar"}, "podman")
    with pytest.raises(LaunchError, match="apptainer keeps no container to save"):
        check_container_options({"container-image": "/i", "container-save": "/x.tar"}, "apptainer")
    with pytest.raises(LaunchError, match="keeps no container to save"):
        adapter("apptainer", {}).launch(spec(save="/x"), HOST)


def test_each_runtime_remaps_root_and_runs_the_entrypoint_only_when_asked(tmp_path):
    image = tmp_path / "img.sif"
    image.write_text("")
    plain = adapter("apptainer", {}).launch(spec(image=str(image)), HOST).argv
    asked = adapter("apptainer", {}).launch(spec(image=str(image), entrypoint=True, remap_root=True), HOST).argv
    assert plain[1] == "exec" and "--fakeroot" not in plain
    assert asked[1] == "run" and "--fakeroot" in asked            # the runscript: ENTRYPOINT with the command
    with pytest.raises(LaunchError, match="binds take ro or rw only, not nosuid"):
        adapter("apptainer", {}).launch(spec(image=str(image), mounts=parse_mounts("/a:/b:ro+nosuid")), HOST)
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    enroot = adapter("enroot", {"store": ""})
    e_plain = enroot.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir)), HOST)
    e_asked = enroot.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), entrypoint=True,
                                 remap_root=False, mounts=parse_mounts("/a:/b:nosuid")), HOST)
    assert "--rc" in e_plain.argv and "ENROOT_REMAP_ROOT" not in e_plain.env      # enroot's config decides
    assert "--rc" not in e_asked.argv and e_asked.env["ENROOT_REMAP_ROOT"] == "n"  # the image's /etc/rc
    conf = e_asked.argv[e_asked.argv.index("--conf") + 1]
    assert "\n/a /b none x-create=auto,rbind,nosuid\n" in Path(conf).read_text()
    podman = adapter("podman", {"store": ""})
    p_plain = podman.launch(spec(image="docker://busybox", runtime="podman"), HOST).argv
    p_asked = podman.launch(spec(image="docker://busybox", runtime="podman", entrypoint=True, remap_root=True), HOST).argv
    assert "--entrypoint=" in p_plain and "--entrypoint=" not in p_asked
    if os.getuid() != 0:
        assert "--userns=keep-id" in p_plain
    assert "--userns=keep-id" not in p_asked                       # rootless podman's root: still you outside


def test_container_save_keeps_the_container_until_it_is_saved(tmp_path):
    rank_dir = str(tmp_path / "42/n2/step-0/rank-3")
    p = adapter("podman", {"store": ""}).launch(spec(image="docker://busybox", runtime="podman", rank_dir=rank_dir,
                                                    save=str(tmp_path / "c.tar")), HOST)
    assert "--rm" not in p.argv
    (steps, partial, final) = p.finish
    assert callable(steps[0]) and final == str(tmp_path / "c.tar") and partial.startswith(final + ".")
    assert p.after == [["podman", "rm", "--force", "--ignore", "tether-42-0-3"]]       # after the save
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    e = adapter("enroot", {"store": ""}).launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir,
                                                    save=str(tmp_path / "c.sqsh")), HOST)
    (steps, partial, final) = e.finish
    assert steps == [["enroot", "export", "--output", partial, "tether-42-0-3"]]
    assert e.after[0] == ["enroot", "remove", "--force", "tether-42-0-3"]


def test_the_batch_script_is_mounted_read_only_at_its_own_path(tmp_path):
    script = tmp_path / "job42" / "slurm_script"
    env = {"TETHER_CONTAINER_IMAGE": "/i", "TETHER_RUN_BATCH": "1", "SLURM_JOB_ID": "42"}
    s = spec_from_env(env, [str(script), "arg"], default_runtime="podman")
    assert s.batch_script == str(script) and s.step_id == "batch" and s.instance == "tether-42-batch-0"
    assert s.command == ("/run/tether/batch-script", "arg")        # under podman's tmpfs: any image takes it
    assert spec_from_env({**env, "TETHER_RUN_BATCH": ""}, [str(script)], default_runtime="podman").batch_script is None
    argv = adapter("podman", {"store": ""}).launch(
        spec(image="docker://busybox", runtime="podman", batch_script=str(script)), HOST).argv
    assert ["--volume", f"{script}:/run/tether/batch-script:ro"] in [argv[i:i + 2] for i in range(len(argv))]
    assert "TETHER_RUN_BATCH" not in passed_from_host({**HOST, "TETHER_RUN_BATCH": "1"}, spec())


def test_a_saved_container_is_written_whole_or_not_at_all_and_a_failure_fails_the_rank(tmp_path):
    from tether.container.launch import save_container
    from tether.container.runtimes import Launch

    final, partial = tmp_path / "c.tar", tmp_path / "c.tar.n1.1.partial"
    ok = Launch(argv=[], env=dict(os.environ), finish=([["sh", "-c", f"echo image > {partial}"]], str(partial),
                                                        str(final)))
    assert save_container(ok) and final.read_text() == "image\n" and not partial.exists()
    bad = Launch(argv=[], env=dict(os.environ), finish=([["sh", "-c", f"echo half > {partial}; exit 3"]],
                                                         str(partial), str(tmp_path / "d.tar")))
    assert save_container(bad) is False
    assert not partial.exists() and not (tmp_path / "d.tar").exists()


def test_podman_loads_an_image_archive_once_under_a_name_of_its_identity(tmp_path):
    archive = tmp_path / "saved.tar"
    archive.write_bytes(b"x")
    launch = adapter("podman", {"store": ""}).launch(spec(image=f"oci-archive:{archive}", runtime="podman"), HOST)
    name = launch.argv[launch.argv.index("--pull=never") + 1]
    assert name.startswith("localhost/tether-archive:") and launch.argv[-3:] == [name, "python", "train.py"]
    (load,) = launch.before
    assert callable(load[0]) and load[2] == f"loading the image archive {archive} into your podman store on this node"
    with pytest.raises(LaunchError, match="no such file"):
        adapter("podman", {"store": ""}).launch(spec(image=f"oci-archive:{tmp_path}/none.tar", runtime="podman"), HOST)


def test_tether_run_with_the_fakes_saves_an_enroot_container_and_runs_apptainers_runscript(
        tmp_path, fake_runtimes, runtime_config):
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 60)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       f"--container-image={sqsh}", f"--container-save={tmp_path}/saved.sqsh",
                       "--container-remap-root", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert f"tether: saved the container to {tmp_path}/saved.sqsh" in proc.stderr
    assert (tmp_path / "saved.sqsh").read_bytes()[:4] == b"hsqs"
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")] == ["create", "start", "export", "remove"]
    (started,) = fake_runtimes.calls("enroot-container")
    assert started["remap_root"] and started["rc"].endswith('exec "$@"\n')
    image = tmp_path / "img.sif"
    image.write_text("")
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, f"--container-image={image}",
                       "--container-runtime=apptainer", "--container-entrypoint", "--", "true")
    assert proc.returncode == 0, proc.stderr
    (call,) = fake_runtimes.calls("apptainer")
    assert call["subcommand"] == "run" and call["command"] == ["true"]


def test_a_save_target_on_no_directory_fails_before_the_workload_runs(tmp_path, fake_runtimes, runtime_config):
    """--container-save into a directory that does not exist was found out after the workload ran
    (issue 45): now the rank fails at once, with the reason, and nothing ran."""
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 60)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       f"--container-image={sqsh}", f"--container-save={tmp_path}/missing/saved.sqsh", "--", "true")
    assert proc.returncode != 0
    assert f"--container-save={tmp_path}/missing/saved.sqsh: its directory {tmp_path}/missing: no such file" in proc.stderr
    assert fake_runtimes.calls("enroot") == []


def test_apptainer_binds_the_pmix_server_and_client_directories_at_their_own_paths(tmp_path):
    """srun --mpi=pmix under Apptainer (issue 15): the server's directory and the step's client
    directory (Slurm's spmix_appdir_<uid>_<job>.<step> under SLURM_PMIX_TMPDIR) enter at their
    host paths; nothing when the step has no PMIx server."""
    server, base = tmp_path / "pmix.42.0", tmp_path / "pmixtmp"
    client = base / f"spmix_appdir_{os.getuid()}_42.0"
    server.mkdir()
    client.mkdir(parents=True)
    image = tmp_path / "img.sif"
    image.write_text("")
    env = {**HOST, "PMIX_SERVER_TMPDIR": str(server), "SLURM_PMIX_TMPDIR": str(base), "SLURM_STEP_ID": "0"}
    argv = adapter("apptainer", {}).launch(spec(image=str(image)), env).argv
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert f"{server}:{server}" in binds and f"{client}:{client}" in binds
    plain = adapter("apptainer", {}).launch(spec(image=str(image)), HOST).argv
    assert [plain[i + 1] for i, a in enumerate(plain) if a == "--bind"] == [
        f"{s}:{t}" for s, t in (("/jobs/42/n2/step-0/rank-3/tmp", "/tmp"),
                                ("/jobs/42/n2/step-0/rank-3/work", "/run/tether/workdir"))]


def test_a_named_podman_container_runs_its_unpacked_root_and_the_jobs_values_win_over_the_images(tmp_path):
    """--container-name with podman: the root unpacked into the job's node directory, the image's
    ENV from a file podman reads before the job's (podman: a later --env-file wins)."""
    rank_dir = str(tmp_path / "42/n2/step-0/rank-3")
    launch = adapter("podman", {"store": ""}).launch(
        spec(image="docker://busybox", runtime="podman", name="dev", rank_dir=rank_dir), HOST)
    home = tmp_path / "42/n2/podman-named/dev"
    argv = launch.argv
    files = [argv[i + 1] for i, a in enumerate(argv) if a == "--env-file"]
    assert files[0] == f"{home}/image.env" and files[1].startswith("/dev/fd/")
    assert argv[-4:] == ["--rootfs", f"{home}/rootfs", "python", "train.py"]
    assert launch.before[-1][1] == f"{home}/config.json" and "tether-42-0-3" in argv     # one container per rank
    (home).mkdir(parents=True)
    (home / "config.json").write_text('{"Entrypoint": ["/entry.sh", "x"]}')
    assert launch.prepare(argv) == argv                                   # no --container-entrypoint
    asked = adapter("podman", {"store": ""}).launch(
        spec(image="docker://busybox", runtime="podman", name="dev", rank_dir=rank_dir, entrypoint=True), HOST)
    assert asked.prepare(asked.argv)[-4:] == ["/entry.sh", "x", "python", "train.py"]
    (home / "config.json").unlink()
    os.mkfifo(home / "config.json")               # the user's own directory: refused, never waited on
    with pytest.raises(LaunchError, match="config.json is not the regular file tether unpacked there"):
        asked.prepare(asked.argv)


def test_container_name_alone_runs_the_jobs_container_of_that_name_or_says_there_is_none(tmp_path):
    """As pyxis: ``srun --container-name=dev CMD`` without an image runs in the job's container
    "dev" on this node (made by an earlier step with an image), and fails with the reason where
    there is none -- never on the host."""
    s = spec_from_env({"TETHER_CONTAINER_NAME": "dev", "SLURM_JOB_ID": "42"}, ["cmd"], default_runtime="podman")
    assert (s.image, s.name) == ("", "dev")
    with pytest.raises(LaunchError, match="no container image"):
        spec_from_env({"SLURM_JOB_ID": "42"}, ["cmd"], default_runtime="podman")
    rank_dir = str(tmp_path / "42/n2/step-1/rank-3")
    alone = spec(image="", runtime="podman", name="dev", rank_dir=rank_dir)
    missing = ("--container-name=dev: this job has no container of that name on this node, and "
               "--container-image is not set")
    with pytest.raises(LaunchError, match=missing):
        adapter("podman", {"store": ""}).launch(alone, HOST)
    home = tmp_path / "42/n2/podman-named/dev"
    (home / "rootfs").mkdir(parents=True)
    (home / "config.json").write_text("{}")
    launch = adapter("podman", {"store": ""}).launch(alone, HOST)
    assert launch.before == [] and launch.argv[-4:] == ["--rootfs", f"{home}/rootfs", "python", "train.py"]
    assert f"{home}/image.env" in launch.argv
    enroot_alone = spec(image="", runtime="enroot", name="dev", rank_dir=rank_dir)
    with pytest.raises(LaunchError, match=missing):
        adapter("enroot", {}).launch(enroot_alone, HOST)
    (tmp_path / "42/n2/enroot/data/tether-42-dev").mkdir(parents=True)        # where enroot create put it
    launch = adapter("enroot", {}).launch(enroot_alone, HOST)
    assert launch.before == [] and "tether-42-dev" in launch.argv and launch.after == []
    with pytest.raises(LaunchError, match="apptainer keeps no container between steps"):
        adapter("apptainer", {}).launch(spec(image="", runtime="apptainer", name="dev", rank_dir=rank_dir), HOST)


def test_pyxis_container_name_flags_auto_no_exec_create_and_exec(tmp_path):
    """pyxis's --container-name=NAME:FLAG. auto and no_exec: the job's container, made when missing
    (tether never enters a running one, so they are one); create: this step makes it -- its other
    ranks find the one its first rank made, a later step is refused; exec: refused with the reason."""
    for flag in ("", ":auto", ":no_exec"):
        s = spec_from_env({"TETHER_CONTAINER_NAME": f"dev{flag}", "TETHER_CONTAINER_IMAGE": "busybox"}, ["cmd"],
                          default_runtime="podman")
        assert (s.name, s.name_create) == ("dev", False)
    assert spec_from_env({"TETHER_CONTAINER_NAME": "dev:create", "TETHER_CONTAINER_IMAGE": "busybox"}, ["cmd"],
                         default_runtime="podman").name_create
    with pytest.raises(LaunchError, match="tether does not enter a container another step is running"):
        spec_from_env({"TETHER_CONTAINER_NAME": "dev:exec"}, ["cmd"], default_runtime="podman")
    with pytest.raises(LaunchError, match="FLAG is one of auto, no_exec, create"):
        spec_from_env({"TETHER_CONTAINER_NAME": "dev:later"}, ["cmd"], default_runtime="podman")
    home = tmp_path / "42/n2/podman-named/dev"

    def podman(step: str, **kw):
        return adapter("podman", {"store": ""}).launch(
            spec(image="docker://busybox", runtime="podman", name="dev", name_create=True,
                 rank_dir=str(tmp_path / f"42/n2/{step}/rank-3"), **kw), HOST)

    first = podman("step-1")                          # none yet: this step unpacks it, and says so first
    assert first.before[-1][1] == f"{home}/config.json"
    home.mkdir(parents=True)
    (home / "made-by").write_text("step-1\n")
    (home / "config.json").write_text("{}")
    assert podman("step-1").argv                      # another rank of the same step
    exists = "--container-name=dev:create: this job already has a container of that name on this node"
    with pytest.raises(LaunchError, match=exists):
        podman("step-2")
    with pytest.raises(LaunchError, match=exists):     # the name alone with create: it is there
        adapter("podman", {"store": ""}).launch(spec(image="", runtime="podman", name="dev", name_create=True,
                                                     rank_dir=str(tmp_path / "42/n2/step-1/rank-0")), HOST)
    (home / "made-by").unlink()
    os.mkfifo(home / "made-by")                       # the user's directory: never waited on, not trusted
    with pytest.raises(LaunchError, match=exists):
        podman("step-1")
    # enroot: the maker is written beside enroot's data, then enroot create runs
    enroot_spec = spec(image=str(tmp_path / "img.sqsh"), runtime="enroot", name="box", name_create=True,
                       rank_dir=str(tmp_path / "42/n2/step-4/rank-0"))
    (tmp_path / "img.sqsh").write_text("")
    launch = adapter("enroot", {}).launch(enroot_spec, HOST)
    create, data = launch.before[-1][0], launch.before[-1][1]
    assert callable(create) and data == str(tmp_path / "42/n2/enroot/data/tether-42-box")
    os.makedirs(data)
    (tmp_path / "42/n2/enroot/made-by-tether-42-box").write_text("step-3\n")
    with pytest.raises(LaunchError, match="--container-name=box:create: this job already has"):
        adapter("enroot", {}).launch(enroot_spec, HOST)
    (tmp_path / "42/n2/enroot/made-by-tether-42-box").write_text("step-4\n")
    assert adapter("enroot", {}).launch(enroot_spec, HOST).argv


# ---- a rank's start-up imports little: what json_text writes, json reads back ------------------------
from hypothesis import given, settings
from hypothesis import strategies as st

_MARKER_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_MARKER_VALUES)
def test_the_markers_json_is_what_json_reads(value):
    from tether.container.launch import json_text

    assert json.loads(json_text(value)) == value


def test_a_supervised_ranks_start_up_imports_neither_re_nor_enum_nor_json():
    """signal.py, re and json each import enum (with functools and collections): milliseconds of
    every rank's start. The launcher's path up to the runtime's exec imports none of them."""
    code = ("import sys\nfrom tether.container.run import handoff\nimport tether.container.runtimes.podman\n"
            "from tether.container.launch import json_text, signal_name\njson_text({'a': ['b', 1, None]})\n"
            "print(' '.join(m for m in ('re', 'enum', 'json', 'signal', 'importlib', 'typing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-IS", "-c", f"import sys; sys.path[:0] = {sys.path!r}\n{code}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", out


def test_the_store_index_is_read_as_go_writes_it():
    from tether.container.runtimes.podman import names_list

    text = ('[{"id":"22dc","names":["127.0.0.1:17065/tether/busybox:1","reg/b:2"],"names-history":["old/c:3"],'
            '"metadata":"{\\"x\\":[]}"},{"id":"99","names":["d/e:4"]}]')
    assert [n for n in ("127.0.0.1:17065/tether/busybox:1", "reg/b:2", "d/e:4") if names_list(text, n)] == [
        "127.0.0.1:17065/tether/busybox:1", "reg/b:2", "d/e:4"]
    for absent in ("old/c:3", "reg/b", "b:2", "", 'x"y', "busybox:1"):   # history, prefixes, quotes: no
        assert not names_list(text, absent), absent
    assert not names_list('[{"names": ["a/b:1"]}]', "a/b:1")             # not as Go writes it: podman decides


def test_the_launcher_takes_the_tasks_command_as_each_slurm_hands_it_over():
    """22.05 and PBS replace argv[0] (the original in TETHER_RUN_ARGV0); 23.11+ prepends the
    launcher (TETHER_RUN_ARGV0 empty); nothing set: not a task at all."""
    from tether.container.run import task_command

    launcher = "/usr/lib/slurm/tether-run"
    assert task_command("sh", [launcher, "-c", "echo $0", "a b"]) == ["sh", "-c", "echo $0", "a b"]
    assert task_command("", [launcher, "sh", "-c", "echo $0", "a b"]) == ["sh", "-c", "echo $0", "a b"]
    assert task_command(None, [launcher, "sh"]) == []
    assert task_command("", [launcher]) == []


def test_the_launcher_script_finds_yaml_without_site_py(tmp_path, monkeypatch):
    """The launcher runs as ``python -IS`` (no site.py): its sys.path names where yaml comes from,
    or a changed config could not be read again (Debian's python3 with python3-yaml: 24.11's root).
    Here tether alone is installed elsewhere, as it is in /usr/local beside Debian's yaml."""
    import tether.container
    from tether.container.run import launcher_text
    from tether.system import toolchain

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "tether").symlink_to(Path(tether.container.__file__).parents[1])
    monkeypatch.setattr(toolchain, "tether_import_path", lambda: str(lib))
    text = launcher_text(None, {})
    header = text.split("from tether.container.run import handoff")[0].split("\n", 1)[1]
    script = tmp_path / "header.py"
    script.write_text(header + "import yaml, tether.hooks.configfile\nprint(yaml.__name__)\n")
    out = subprocess.run([sys.executable, "-IS", str(script)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "yaml\n", out.stderr


def test_tether_images_ls_is_a_table_with_readable_sizes(monkeypatch, capsys, tmp_path):
    """`tether images ls`: aligned columns, sizes as podman shows them (it printed raw bytes)."""
    import argparse

    from tether.cli import containers
    from tether.container.runtimes import StoredImage

    class Store:
        def stored(self, env):
            return [StoredImage(name="127.0.0.1:17005/team/app:1", size=4281615, last_used=0.0, where="/var/tmp/s"),
                    StoredImage(name="localhost/x:2", size=12_500_000_000, last_used=0.0, where="/var/tmp/s"),
                    StoredImage(name="tiny", size=512, last_used=0.0, where="/var/tmp/s")]

    monkeypatch.setattr(containers, "_image_runtimes", lambda settings, names: [("podman", Store())])
    config = tmp_path / "tether.yaml"
    config.write_text("job_storage_root: /var/lib/tether/jobs\n")
    assert containers.images(argparse.Namespace(action="ls", runtime=None, config=str(config))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUNTIME", "SIZE", "LAST", "USED", "IMAGE", "WHERE"]
    sizes = [" ".join(line.split()[1:3]) for line in lines[1:]]
    assert sizes == ["4.3 MB", "12.5 GB", "512 B"]
    assert len({line.index(size) + len(size) for line, size in zip(lines[1:], sizes)}) == 1   # right-aligned
    assert len({line.index("/var/tmp/s") for line in lines[1:]}) == 1      # one column


# ---- --container-unshare (pyxis 0.24) ------------------------------------------------------------
def test_container_unshare_is_read_from_the_task_and_checked():
    env = {"TETHER_CONTAINER_IMAGE": "/img", "TETHER_CONTAINER_UNSHARE": "uts,net"}
    assert spec_from_env(env, ["true"], default_runtime="podman").unshare == ("net", "uts")   # pyxis's order
    assert spec_from_env({"TETHER_CONTAINER_IMAGE": "/img"}, ["true"], default_runtime="podman").unshare == ()
    for bad, why in (("net,foo", "unknown namespace 'foo'"), ("net,", "empty namespace argument")):
        with pytest.raises(LaunchError, match=f"--container-unshare={bad}: {why}"):
            spec_from_env({**env, "TETHER_CONTAINER_UNSHARE": bad}, ["true"], default_runtime="podman")
    check_container_options({"container-image": "/i", "container-unshare": "net"}, "podman")
    with pytest.raises(LaunchError, match="does not unshare namespaces with apptainer"):
        check_container_options({"container-image": "/i", "container-unshare": "net"}, "apptainer")


def test_podman_gives_the_container_the_namespaces_it_asks_for(monkeypatch):
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    podman = adapter("podman", {"store": ""})
    plain = podman.launch(spec(image="docker://busybox", runtime="podman"), HOST).argv
    assert "--network=host" in plain and not [a for a in plain if a.startswith(("--ipc", "--uts", "--hostname"))]
    net = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("net",)), HOST).argv
    assert "--network=none" in net and "--network=host" not in net           # only a loopback interface
    assert f"--hostname={os.uname().nodename}" in net                         # not the container's id
    every = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("net", "ipc", "uts")), HOST).argv
    at = every.index("--network=none")
    assert every[at:at + 4] == ["--network=none", "--ipc=private", "--uts=private",
                                f"--hostname={os.uname().nodename}"]


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_apptainer_refuses_unshare_at_launch_too(runtime):
    """A step inside an allocation is never seen by the job_submit plugin: --container-unshare (or
    an inherited TETHER_/PYXIS_CONTAINER_UNSHARE) on Apptainer/Singularity reached the launcher,
    which ran the container in the host's network without a word (a hostile review's finding)."""
    env = {"TETHER_CONTAINER_IMAGE": "/tmp", "TETHER_CONTAINER_UNSHARE": "net"}
    unshared = spec_from_env(env, ["hostname", "-I"], default_runtime=runtime)
    with pytest.raises(LaunchError, match=f"--container-unshare: tether does not unshare namespaces with {runtime} "
                                          r"yet \(the container would run in the host's net\)"):
        adapter(runtime, {}).launch(unshared, HOST)


def test_an_unshare_value_longer_than_any_option_value_is_refused_by_python_as_by_c():
    """spank/options.c refuses a --container-unshare value over TETHER_MAX_TEXT bytes; the Python
    twin accepted "net,net,..." of any length (a hostile review's finding)."""
    from tether.hooks.surface import MAX_TEXT, OPTIONS, normalize

    opt = next(o for o in OPTIONS if o.name == "container-unshare")
    fits = ",".join(["net"] * (MAX_TEXT // 4))
    assert len(fits) <= MAX_TEXT and normalize(opt, fits) == fits
    too_long = ",".join(["net"] * (MAX_TEXT // 4 + 2))
    assert len(too_long) > MAX_TEXT and normalize(opt, too_long) is None


def test_enroot_unshares_with_start_flags_and_refuses_an_enroot_that_cannot(tmp_path, fake_runtimes, monkeypatch):
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    rank_dir = str(tmp_path / "42/n2/step-0/rank-3")
    s = spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir, unshare=("net", "uts"))
    # the strict fake is enroot 4.1.2 (conformance/enroot.json): no --net/--ipc/--uts, and its
    # ENROOT_UNSHARE_* variables (what pyxis 0.24 sets) are ignored -- refused, never silently shared
    recorded = adapter("enroot", {"store": "", "binary": str(fake_runtimes.bin_dir / "enroot")})
    with pytest.raises(LaunchError, match=r"--container-unshare=net,uts: enroot 4\.1\.2 cannot give a container "
                                          r"namespaces of its own .* or --container-runtime=podman"):
        recorded.launch(s, HOST)
    newer = adapter("enroot", {"store": ""})
    monkeypatch.setattr("tether.system.proc.run_command",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "4.2.0\n", ""))
    argv = newer.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir, writable=True,
                             unshare=("net", "ipc", "uts")), HOST).argv
    assert argv[:6] == ["enroot", "start", "--rw", "--net", "--ipc", "--uts"]
    assert not [a for a in newer.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir), HOST).argv
                if a in ("--net", "--ipc", "--uts")]


# ---- pyxis 0.24's mount grammar and workdir rules, on podman and enroot (issue 45) ------------------
def _pairs(argv: list[str]) -> list[list[str]]:
    return [argv[i:i + 2] for i in range(len(argv) - 1)]


def test_every_source_form_pyxis_takes_parses_and_each_target_becomes_absolute():
    """SRC is an absolute path, a relative one (any text starting with '.'), tmpfs or umount; DST
    absolute or relative to the container's root; the one-part form mounts a path at itself."""
    assert parse_mounts("./:/in,./file.txt:/f,../up:/u,.hidden:/h") == (
        Mount("./", "/in"), Mount("./file.txt", "/f"), Mount("../up", "/u"), Mount(".hidden", "/h"))
    assert parse_mounts("/var/lib,./data") == (Mount("/var/lib", "/var/lib"), Mount("./data", "/data"))
    assert parse_mounts("/a:./mnt/x,/b:/c/../d/./e/") == (Mount("/a", "/mnt/x"), Mount("/b", "/d/e"))
    assert parse_mounts("/tmp/a dir:/mnt/my mount:ro") == (Mount("/tmp/a dir", "/mnt/my mount", True),)
    assert parse_mounts("/x/../y:/z")[0].source == "/x/../y"          # as the kernel resolves it, on the node
    tmpfs, gone = parse_mounts("tmpfs:/scratch:size=1G+huge=within_size+mode=1777,umount:/root")
    assert (tmpfs.kind, tmpfs.options, tmpfs.create) == ("tmpfs", ("size=1G", "huge=within_size", "mode=1777"), "dir")
    assert gone == Mount("umount", "/root") and gone.kind == "umount"
    for bad, why in (("/a:../home", r"leads out of the container's root"), ("/a:/x/../../y", "leads out"),
                     ("tmpfs", "the target must be"), ("devpts:/d:ro", "the source must be"),
                     ("data/x:/d", r"\(./data/x for a path relative")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)


def test_every_flag_pyxis_passes_to_enroot_that_means_something_is_taken():
    """ro/rw, [no]suid, [no]dev, [no]exec, each propagation with unbindable, bind/rbind (a bind is
    recursive either way, as pyxis's own flags always add rbind), x-create; empty flags are
    nothing (enroot skips them)."""
    (m,) = parse_mounts("/tmp:/mnt:unbindable+ro")
    assert (m.readonly, m.flags, str(m)) == (True, ("unbindable",), "/tmp:/mnt:ro,unbindable")
    (m,) = parse_mounts("/a:/b:suid+dev+exec+runbindable+bind+rbind+x-create=file")
    assert (m.flags, m.create) == (("suid", "dev", "exec", "runbindable"), "file")
    assert parse_mounts("/a:/b:,/c:/d:ro+") == (Mount("/a", "/b"), Mount("/c", "/d", True))
    for bad, why in (("tmpfs:/t:size=lots", "'size=lots' is not a value tmpfs takes"),
                     ("tmpfs:/t:huge=sometimes", r"huge= is one of never, always, within_size"),
                     ("tmpfs:/t:huge=deny", r"huge= is one of never, always, within_size, advise\)$"),  # sysfs only
                     ("tmpfs:/t:mode=999", "not a value"), ("tmpfs:/t:size=1G+size=2G", "size= twice"),
                     ("tmpfs:/t:rbind", "unknown flag 'rbind' for a tmpfs"), ("/a:/b:size=1G", "unknown flag"),
                     ("/a:/b:noatime", "unknown flag 'noatime'")):
        with pytest.raises(LaunchError, match=why):
            parse_mounts(bad)
    assert parse_mounts("tmpfs:/t:size=50%+nr_inodes=10k+uid=1000+gid=1000+ro+noexec")[0].options == (
        "size=50%", "nr_inodes=10k", "uid=1000", "gid=1000")


def test_relative_sources_are_resolved_on_the_node_from_the_working_directory_never_at_submit(tmp_path, monkeypatch):
    """pyxis's enroot mounts ``./x`` from the step's working directory on the node: the launcher
    (the user, in the task's working directory) resolves it, symlinks as the kernel follows them;
    the submit check (slurmctld, root) never looks at the file system for it."""
    from tether.container.spec import check_mount_sources, resolve_sources

    (tmp_path / "data").mkdir()
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    mounts = resolve_sources(parse_mounts("./:/w,../in.txt:/f,../link:/l,tmpfs:/t,umount:/u,/abs:/a"),
                             str(tmp_path / "data"))
    assert [m.source for m in mounts] == [str(tmp_path / "data"), str(tmp_path / "in.txt"), str(tmp_path / "data"),
                                          "tmpfs", "umount", "/abs"]
    # '..' after a symlink: from where the link leads (the kernel's walk), not a lexical shortening
    (tmp_path / "data" / "in.txt").write_text("y")
    (mount,) = resolve_sources(parse_mounts("./link/../data/in.txt:/g"), str(tmp_path))
    assert mount.source == str(tmp_path / "data/in.txt")
    (mount,) = resolve_sources(parse_mounts("/x/./y/../z:/g"), "/unused")
    assert mount.source == "/x/z"
    monkeypatch.chdir(tmp_path)
    env = {**HOST, "TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_MOUNTS": "./data:/d,./in.txt:/f"}
    s = spec_from_env(env, ["true"], default_runtime="podman")
    assert [m.source for m in s.mounts] == [str(tmp_path / "data"), str(tmp_path / "in.txt")]
    with pytest.raises(LaunchError, match=f"^--container-mounts: {tmp_path}/nope: no such file or directory"):
        check_mount_sources(spec_from_env({**env, "TETHER_CONTAINER_MOUNTS": "./nope:/n"}, ["true"],
                                          default_runtime="podman").mounts)
    check_mount_sources(parse_mounts("tmpfs:/t,umount:/u"))      # nothing on the host to check

    def touched(*a, **kw):
        raise AssertionError("the submit check looked at the file system")

    monkeypatch.setattr(os.path, "realpath", touched)
    monkeypatch.setattr(os, "getcwd", touched)
    check_container_options({"container-image": "/i", "container-mounts": "./data:/d,../x:/x"}, "podman")


def test_podman_gets_binds_as_volumes_tmpfs_as_tmpfs_and_umount_takes_a_mount_away(tmp_path):
    """podman (4.3 and 5 alike): a bind is ``--volume SRC:DST[:FLAGS]`` (a path with spaces as it
    is), a tmpfs ``--tmpfs DST[:size=,mode=,...]``; podman takes one mount a target, so a later
    entry replaces an earlier one and ``umount:DST`` drops what the admin, --container-mount-home
    or an earlier entry put there -- and is refused for anything else (podman's own mounts stay)."""
    rootfs, home = tmp_path / "rootfs", tmp_path / "home dir"
    rootfs.mkdir()
    home.mkdir()
    host = {**HOST, "HOME": str(home)}
    podman = adapter("podman", {})
    mounts = parse_mounts("/tmp/a dir:/mnt/my mount:ro+unbindable,tmpfs:/scratch:size=1G+mode=1777,"
                          "/x:/dup,/y:/dup:nosuid")
    argv = podman.launch(spec(image=str(rootfs), runtime="podman", mounts=mounts, mount_home=True), host).argv
    pairs = _pairs(argv)
    assert ["--volume", "/tmp/a dir:/mnt/my mount:ro,unbindable"] in pairs
    assert ["--tmpfs", "/scratch:size=1G,mode=1777"] in pairs
    assert ["--volume", "/y:/dup:nosuid"] in pairs and ["--volume", "/x:/dup"] not in pairs
    assert ["--volume", f"{home}:{home}"] in pairs
    gone = podman.launch(spec(image=str(rootfs), runtime="podman", mount_home=True,
                              mounts=parse_mounts(f"/a:/b,umount:{home},umount:/b")), host).argv
    assert not [a for a in gone if a.endswith((f":{home}", ":/b"))]
    with pytest.raises(LaunchError, match=r"umount:/proc: nothing is mounted there .* pyxis's enroot unmounts any"):
        podman.launch(spec(image=str(rootfs), runtime="podman", mounts=parse_mounts("umount:/proc")), host)
    with pytest.raises(LaunchError, match=r"podman takes only size= and mode= for a tmpfs, not huge=within_size "
                                          r"\(enroot, as pyxis, takes every tmpfs option"):
        podman.launch(spec(image=str(rootfs), runtime="podman", mounts=parse_mounts("tmpfs:/t:huge=within_size")),
                      host)
    # the same refusals at submit, for the runtime the job will use
    with pytest.raises(LaunchError, match="podman takes only size= and mode="):
        check_container_options({"container-image": "/i", "container-mounts": "tmpfs:/t:huge=within_size"}, "podman")
    check_container_options({"container-image": "/i", "container-mounts": "tmpfs:/t:huge=within_size"}, "enroot")
    for runtime in ("apptainer", "singularity"):
        for entry in ("tmpfs:/t", "umount:/u"):
            with pytest.raises(LaunchError, match=f"tether does no (tmpfs|umount) mounts with {runtime}"):
                check_container_options({"container-image": "/i.sif", "container-mounts": entry,
                                         "container-runtime": runtime}, "podman")
    sif = tmp_path / "img.sif"
    sif.write_text("")
    with pytest.raises(LaunchError, match="tether does no tmpfs mounts with apptainer"):
        adapter("apptainer", {}).launch(spec(image=str(sif), mounts=parse_mounts("tmpfs:/t")), HOST)


def test_a_relative_source_where_others_write_or_one_the_runtime_would_split_is_refused(tmp_path):
    """slurmstepd starts a step in /tmp when the job's directory is missing on the node: there
    ``./data`` may be another user's. A resolved source with ':' or ',' would be split by podman's
    --volume or Apptainer's --bind (enroot's fstab line carries it). A vanished working directory
    is a message, not a traceback."""
    from tether.container.spec import resolve_sources

    shared = tmp_path / "shared"
    (shared / "data").mkdir(parents=True)
    os.chmod(shared, 0o1777)
    with pytest.raises(LaunchError, match="a relative source in .*others can write .* is refused"):
        resolve_sources(parse_mounts("./data:/d"), str(shared), runtime="podman")
    assert resolve_sources(parse_mounts(f"{shared}/data:/d"), str(shared))[0].source == f"{shared}/data"  # absolute
    odd = tmp_path / "a:b,c"
    odd.mkdir()
    for runtime in ("podman", "apptainer"):
        with pytest.raises(LaunchError, match="would read as a separator"):
            resolve_sources(parse_mounts("./:/d"), str(odd), runtime=runtime)
    assert resolve_sources(parse_mounts("./:/d"), str(odd), runtime="enroot")[0].source == str(odd)
    with pytest.raises(LaunchError, match="the working directory is gone"):
        resolve_sources(parse_mounts("./x:/d"), str(tmp_path / "gone"), runtime="podman")


def test_an_enroot_mount_line_longer_than_enroot_reads_is_refused():
    """enroot-mount reads fstab lines into a 4096-byte buffer and getmntent cuts a longer one:
    escaped blanks (4 bytes each) could push ro,nosuid off the end, silently."""
    from tether.container.runtimes.enroot import FSTAB_LINE_MAX, fstab_line

    (mount,) = parse_mounts("/h:/" + "a " * 1010 + "x:ro+nosuid")
    with pytest.raises(LaunchError, match="more than enroot reads"):
        fstab_line(mount)
    assert len(fstab_line(parse_mounts("/h:/" + "a" * 2000)[0]).encode()) < FSTAB_LINE_MAX


def test_enroot_gets_every_mount_as_an_fstab_line_of_its_config_in_order(tmp_path):
    """enroot start's --mount refuses blanks (and splits on ':'), so every mount goes into the
    --conf script's mounts(), as pyxis writes them: fstab lines with \\040 for a space, the rank's
    directories first and the user's after (on top), tmpfs with its options, umount as x-detach."""
    from tether.container.runtimes.enroot import fstab_line

    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    mounts = parse_mounts("/tmp/a dir:/mnt/my mount:ro+unbindable,tmpfs:/scratch:size=1G+huge=within_size,"
                          "umount:/root,/etc/hosts:/h:x-create=file,/back\\slash:/b")
    launch = adapter("enroot", {"store": ""}).launch(
        spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), mounts=mounts), HOST)
    assert "--mount" not in launch.argv
    text = Path(launch.argv[launch.argv.index("--conf") + 1]).read_text()
    lines = text.split("mounts() {\n", 1)[1].splitlines()
    assert lines[0] == "cat <<'TETHER_END_OF_MOUNTS'" and lines[8:] == ["TETHER_END_OF_MOUNTS", "}"]
    assert lines[1:8] == [
        f"{rank_dir}/tmp /tmp none x-create=dir,bind",
        f"{rank_dir}/work /run/tether/workdir none x-create=dir,bind",
        "/tmp/a\\040dir /mnt/my\\040mount none x-create=auto,rbind,ro,unbindable",
        "tmpfs /scratch tmpfs x-create=dir,size=1G,huge=within_size",
        "umount /root none x-detach",
        "/etc/hosts /h none x-create=file,rbind",
        "/back\\134slash /b none x-create=auto,rbind"]
    assert fstab_line(Mount("/a b", "/c")) == "/a\\040b /c none x-create=auto,rbind"


def test_tether_run_mounts_a_relative_source_with_spaces_through_enroot(tmp_path, fake_runtimes, runtime_config):
    """End to end with the strict enroot fake: a relative source from the task's working directory,
    spaces on both sides, reach enroot's fstab decoded; a missing relative source is refused
    before enroot runs, naming where tether looked."""
    work = tmp_path / "job dir"
    (work / "in put").mkdir(parents=True)
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    common = ["--container-runtime=enroot", f"--container-image={sqsh}"]
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, *common,
                       "--container-mounts=./in put:/my data:ro,tmpfs:/scratch:huge=within_size",
                       "--container-workdir=my data", "--", "true", cwd=str(work))
    assert proc.returncode == 0, proc.stderr
    (started,) = fake_runtimes.calls("enroot-container")
    assert [str(work / "in put"), "/my data", "none", "x-create=auto,rbind,ro"] in started["fstab"]
    assert ["tmpfs", "/scratch", "tmpfs", "x-create=dir,huge=within_size"] in started["fstab"]
    assert started["command"][-3:] == ["sh", "/my data", "true"]          # relative: from the root
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, *common, "--container-mounts=./nope:/n",
                       "--", "true", cwd=str(work))
    assert (proc.returncode, proc.stderr) == (
        125, f"tether: --container-mounts: {work}/nope: no such file or directory on this node\n")


def test_the_workdir_follows_pyxis_relative_from_the_root_and_never_above_it(tmp_path):
    """pyxis changes to --container-workdir inside the container: relative from the root, '..'
    at the root stays there, blanks allowed; a directory the image lacks is not made (pyxis: "No
    such file or directory"; podman refuses a missing --workdir, enroot's cd fails)."""
    env = {**HOST, "TETHER_CONTAINER_IMAGE": "/i"}

    def workdir(value: str) -> str:
        return spec_from_env({**env, "TETHER_CONTAINER_WORKDIR": value}, ["true"], default_runtime="podman").workdir

    assert [workdir(v) for v in ("/usr/local/bin", "../", "work/x", "./a b/", "/a/../../b")] == [
        "/usr/local/bin", "/", "/work/x", "/a b", "/b"]
    check_container_options({"container-image": "/i", "container-workdir": "rel dir"}, "podman")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    argv = adapter("podman", {}).launch(spec(image=str(rootfs), runtime="podman", workdir="/a b"), HOST).argv
    assert ["--workdir", "/a b"] in _pairs(argv)
    from tether.container.runtimes.enroot import CD_PROLOGUE

    assert CD_PROLOGUE.startswith('cd "$1" || exit 125')        # no mkdir: a missing one fails, as pyxis

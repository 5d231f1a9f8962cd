"""The podman adapter (tether.container.runtimes.podman) without a cluster: exact argv, GPUs and MPI,
shared rootfs imports, pulls, its store, the stale-state repairs and the removals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from hashlib import sha256
from pathlib import Path

import pytest

from tether.container.runtimes import adapter
from tether.container.spec import CONTAINER_WORKDIR, LaunchError, Mount, parse_mounts

from container_helpers import HOST, _as_user, spec


def test_podman_argv_keeps_values_off_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    monkeypatch.setattr("tether.container.runtimes.podman.node_has_mqueue", lambda: True)
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
        "--label", "tether.job=42", "--label", "tether.step=42.0", "--network=host", "--ipc=host", "--uts=host",
        "--pid=host",
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
    with pytest.raises(LaunchError, match=r"is none of them \(a SIF image is Apptainer's or Singularity's"):
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


@pytest.mark.parametrize("stays_for,removed", [(2, True), (99, False)])
def test_podman_removal_counts_only_a_container_podman_no_longer_knows(tmp_path, monkeypatch, stays_for, removed):
    """Regression (issue 12, soak): `podman rm` answered 0 at a time limit and left a stopped
    container (its record stayed, the marker went). Removal now checks `podman container exists`
    and tries again; a container that stays keeps its marker for the cleanup run."""
    monkeypatch.setattr("tether.container.runtimes.podman.REMOVE_BACKOFF", 0.01)   # the tries, not their waits
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


def test_podmans_launch_names_its_pause_process_in_its_run_directory(tmp_path):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    run = tmp_path / "run"
    launch = adapter("podman", {"env": {"XDG_RUNTIME_DIR": str(run)}}).launch(
        spec(image=str(rootfs), runtime="podman"), {**HOST, "XDG_RUNTIME_DIR": "/run/user/1000"})
    assert launch.runtime_own == ((f"{run}/libpod/tmp/pause.pid", ("catatonit", "podman pause", "podman")),)


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
                "PMIX_DSTORE_21_BASE_PATH": f"{server}//pmix_dstor_ds21_7", "PMIX_NAMESPACE": "slurm.pmix.42.0",
                "PMIX_SECURITY_MODE": "native", "PMIX_GDS_MODULE": "ds21,ds12,hash", "PMIX_PTL_MODULE": "tcp",
                "PMIX_MCA_ptl": "usock"}
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
    # the MCA names enroot's PMIx hook adds, unless the job set one (pyxis's mpi.bats)
    assert "PMIX_MCA_psec=native" in argv and "PMIX_MCA_gds=ds21,ds12,hash" in argv
    assert not [a for a in argv if a.startswith("PMIX_MCA_ptl=")] and "PMIX_MCA_ptl" in names
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
                                             (full, True, "", "writable: --container-writable, or the admin's "
                                                               "container.writable")):
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


def test_podman_pulls_a_registry_image_once_per_node_before_running_it(tmp_path):
    s = spec(image="127.0.0.1:5000/team/app:1", runtime="podman", rank_dir=str(tmp_path / "42/n2/step-0/rank-3"))
    launch = adapter("podman", {"args": ["--runtime", "runc"]}).launch(s, HOST)
    name = "127.0.0.1:5000/team/app:1"
    store = launch.argv[4:8]
    assert store[:2] == ["--root", f"{tmp_path}/podman-store-{os.getuid()}/storage"]
    ((pull, (quick, exists), label, failure), (_, checked)) = launch.before
    assert checked == f"{tmp_path}/42/n2/podman/checked-{sha256(name.encode()).hexdigest()[:16]}"   # the job's, below
    assert pull == ["podman", "--runtime", "runc", *store, "pull", "--quiet", name]
    assert exists == ["podman", "--runtime", "runc", *store, "image", "exists", name]
    assert label == "pulling 127.0.0.1:5000/team/app:1 (podman)"
    assert failure == "failed to import docker image: 127.0.0.1:5000/team/app:1"       # pyxis's words
    assert launch.failures == f"{tmp_path}/42/n2/step-0"       # the step's other ranks here: no second try
    assert quick() is False                             # not in the store's index: podman decides
    index = tmp_path / f"podman-store-{os.getuid()}/storage/vfs-images"
    index.mkdir(parents=True)
    (index / "images.json").write_text(json.dumps([{"id": "ab", "names": [name]}], separators=(",", ":")))   # compact, as Go writes it
    assert quick() is True                              # listed there: no podman process at all
    # the user's ranks and jobs on this node share the store's lock
    assert launch.lock == f"{tmp_path}/podman-store-{os.getuid()}/.pull-lock"
    assert launch.argv[-4:-2] == ["--pull=never", name]
    own = adapter("podman", {"args": ["--runtime", "runc"], "store": ""}).launch(s, HOST)   # podman's default
    assert callable(own.before[0][0]) and "/checked-" in own.before[0][1]    # its index unread: the check pulls
    assert own.lock == str(tmp_path / "42/n2/podman/.pull-lock")        # the node's ranks of this job


def test_a_tagged_image_in_the_store_is_checked_against_its_registry_once_per_job(fp_quick, tmp_path, capfd):
    fp = fp_quick
    """A tag can move (a new push of app:1): pyxis imports the image anew every step, so a job of a
    pyxis user always runs what the tag names. tether keeps the store's copy but checks it against
    the registry once per job on each node (podman pull: the manifest; layers only when changed),
    says when it changed, and runs the store's copy, saying so, when the registry is unreachable.
    By digest: never checked."""
    from tether.container.launch import run_before

    name = "127.0.0.1:5000/team/app:1"
    index = tmp_path / f"podman-store-{os.getuid()}/storage/vfs-images"
    index.mkdir(parents=True)
    (index / "images.json").write_text(json.dumps([{"id": "old", "names": [name]}], separators=(",", ":")))
    podman = adapter("podman", {"args": ["--runtime", "runc"]})

    def plan(job: str, image: str = name):
        return podman.launch(spec(image=image, runtime="podman", job_id=job,
                                  rank_dir=str(tmp_path / f"{job}/n2/step-0/rank-3")), HOST)

    launch = plan("42")
    ((check, marker),) = launch.before                       # in the store: a check, not a pull
    assert callable(check) and marker.startswith(f"{tmp_path}/42/n2/podman/checked-")
    pull = ["podman", "--runtime", "runc", *launch.argv[4:8], "pull", "--quiet", name]
    fp.register(pull, stdout="new\n")                        # the tag has moved: a new image id
    run_before(launch)
    assert fp.call_count(pull) == 1 and os.path.exists(marker)
    assert ("tether: 127.0.0.1:5000/team/app:1 has changed in its registry since your store's copy: pulled the "
            "new one") in capfd.readouterr().err
    run_before(plan("42"))                                   # the job's next step, or rank: no second check
    assert fp.call_count(pull) == 1
    fp.register(pull, returncode=125, stderr="Error: initializing source docker://127.0.0.1:5000/team/app:1: "
                                             "pinging container registry 127.0.0.1:5000: connection refused\n")
    run_before(plan("43"))                                   # the next job: checked; the registry is down
    assert fp.call_count(pull) == 2
    err = capfd.readouterr().err
    assert ("tether: could not check 127.0.0.1:5000/team/app:1 against its registry (Error: initializing source "
            "docker://127.0.0.1:5000/team/app:1: pinging container registry 127.0.0.1:5000: connection refused); "
            "running the copy in your store on this node") in err
    fp.register(pull, stdout="old\n")
    run_before(plan("44"))                                   # unchanged: nothing said
    assert fp.call_count(pull) == 3 and "tether:" not in capfd.readouterr().err
    pinned = f"127.0.0.1:5000/team/app@sha256:{'a' * 64}"
    assert [len(step) for step in plan("45", pinned).before] == [4]     # by digest: the pull alone, never a check


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


def test_container_save_keeps_the_container_until_it_is_saved(tmp_path):
    rank_dir = str(tmp_path / "42/n2/step-0/rank-3")
    p = adapter("podman", {"store": ""}).launch(spec(image="docker://busybox", runtime="podman", rank_dir=rank_dir,
                                                    save=str(tmp_path / "c.tar")), HOST)
    assert "--rm" not in p.argv
    (steps, partial, final) = p.finish
    assert callable(steps[0]) and final == str(tmp_path / "c.tar") and partial.startswith(final + ".")
    assert p.after == [["podman", "rm", "--force", "--ignore", "--volumes", "tether-42-0-3"]]       # after the save
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    e = adapter("enroot", {"store": ""}).launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir,
                                                    save=str(tmp_path / "c.sqsh")), HOST)
    (steps, partial, final) = e.finish
    assert steps == [["enroot", "export", "--output", partial, "tether-42-0-3"]]
    assert e.after[0] == ["enroot", "remove", "--force", "tether-42-0-3"]


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
    assert launch.before[-2][1] == f"{home}/config.json" and "tether-42-0-3" in argv     # one container per rank
    (home).mkdir(parents=True)
    (home / "config.json").write_text('{"Entrypoint": ["/entry.sh", "x"]}')
    assert launch.prepare(argv) == argv                                   # no --container-entrypoint
    asked = adapter("podman", {"store": ""}).launch(
        spec(image="docker://busybox", runtime="podman", name="dev", rank_dir=rank_dir, entrypoint=True), HOST)
    prepared = asked.prepare(asked.argv)     # before the shell that sets the job's other variables
    assert prepared[-9:-5] == ["/entry.sh", "x", "/bin/sh", "-c"] and prepared[-2:] == ["python", "train.py"]
    (home / "config.json").unlink()
    os.mkfifo(home / "config.json")               # the user's own directory: refused, never waited on
    with pytest.raises(LaunchError, match="config.json is not the regular file tether unpacked there"):
        asked.prepare(asked.argv)


def test_the_store_index_is_read_as_go_writes_it():
    from tether.container.runtimes.podman import names_list

    text = ('[{"id":"22dc","names":["127.0.0.1:17065/tether/busybox:1","reg/b:2"],"names-history":["old/c:3"],'
            '"metadata":"{\\"x\\":[]}"},{"id":"99","names":["d/e:4"]}]')
    assert [n for n in ("127.0.0.1:17065/tether/busybox:1", "reg/b:2", "d/e:4") if names_list(text, n)] == [
        "127.0.0.1:17065/tether/busybox:1", "reg/b:2", "d/e:4"]
    for absent in ("old/c:3", "reg/b", "b:2", "", 'x"y', "busybox:1"):   # history, prefixes, quotes: no
        assert not names_list(text, absent), absent
    assert not names_list('[{"names": ["a/b:1"]}]', "a/b:1")             # not as Go writes it: podman decides


def test_podman_gives_the_container_the_namespaces_it_asks_for(monkeypatch):
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    monkeypatch.setattr("tether.container.runtimes.podman.node_has_mqueue", lambda: True)
    podman = adapter("podman", {"store": ""})
    plain = podman.launch(spec(image="docker://busybox", runtime="podman"), HOST).argv
    at = plain.index("--network=host")          # the node's network, IPC and UTS namespaces, as pyxis's
    assert plain[at:at + 3] == ["--network=host", "--ipc=host", "--uts=host"] and not \
        [a for a in plain if a.startswith("--hostname")]
    # a node without /dev/mqueue (podman binds it for the node's IPC namespace): podman's private one
    monkeypatch.setattr("tether.container.runtimes.podman.node_has_mqueue", lambda: False)
    plain = podman.launch(spec(image="docker://busybox", runtime="podman"), HOST).argv
    assert plain[at:at + 2] == ["--network=host", "--uts=host"] and "--ipc=host" not in plain
    # a container by hand (`tether run`, no step): namespaces of its own
    net = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("net",), rank_dir=None), HOST).argv
    assert "--network=none" in net and "--network=host" not in net           # only a loopback interface
    # the node's UTS namespace has the node's name (podman refuses --hostname there)
    assert "--uts=host" in net and not [a for a in net if a.startswith("--hostname")]
    every = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("net", "ipc", "uts"),
                               rank_dir=None), HOST).argv
    at = every.index("--network=none")
    assert every[at:at + 4] == ["--network=none", "--ipc=private", "--uts=private",
                                f"--hostname={os.uname().nodename}"]


def test_a_steps_ranks_on_a_node_share_the_namespaces_they_unshare_in_the_steps_pod(tmp_path, monkeypatch):
    """pyxis runs a step's tasks on a node in one container: with --container-unshare they share
    its namespaces (pyxis's suite: four tasks, one IPC, UTS or network namespace, not the
    node's). tether's ranks are containers of a pod per step and node, which holds the namespaces
    asked for; the others stay the node's."""
    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    monkeypatch.setattr("tether.container.runtimes.podman.node_has_mqueue", lambda: True)
    podman = adapter("podman", {"store": ""})
    ipc = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("ipc",)), HOST)
    at = ipc.argv.index("--pod")
    assert ipc.argv[at:at + 5] == ["--pod", "tether-42-0-pod", "--network=host", "--uts=host", "--pid=host"]
    assert "--userns=keep-id" not in ipc.argv                    # the pod's: a container there has none
    join = ipc.before[-1]
    assert callable(join[0]) and join[1] is None and len(join) == 2     # quiet, every rank
    assert callable(ipc.after[-1])
    every = podman.launch(spec(image="docker://busybox", runtime="podman", unshare=("net", "ipc", "uts")), HOST)
    at = every.argv.index("--pod")
    assert every.argv[at:at + 3] == ["--pod", "tether-42-0-pod", "--pid=host"]
    from tether.container.runtimes.podman import pod_args

    assert pod_args(("ipc",)) == ["--share=ipc", "--network=host"]
    assert pod_args(("net", "uts", "ipc")) == ["--share=ipc,uts,net", "--network=none",
                                               f"--hostname={os.uname().nodename}"]


def test_the_last_rank_to_leave_the_steps_pod_removes_it(tmp_path):
    """join_pod/leave_pod with a podman that records what it is asked: one pod for the step's
    ranks on the node, made by the first to join (its cleanup marker first), removed by the last to
    leave (the marker with it); a join tried again counts once; a rank killed before it left keeps
    the pod -- and the marker, for the step's cleanup."""
    from tether.container.runtimes.podman import join_pod

    calls = tmp_path / "calls"
    fake = tmp_path / "podman"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    step = tmp_path / "step-0"
    step.mkdir()
    podman = adapter("podman", {"store": "", "binary": str(fake)})
    create = ["--name", "tether-42-0-pod"]
    env = dict(os.environ)

    def said() -> list[str]:
        return calls.read_text().splitlines() if calls.exists() else []

    join_pod([str(fake)], create, "tether-42-0-pod", str(step), "0", env)
    marker = json.loads((step / ".cleanup-pod").read_text())
    assert marker == {"runtime": "podman", "container": "tether-42-0-pod", "pod": "1"}
    join_pod([str(fake)], create, "tether-42-0-pod", str(step), "1", env)
    join_pod([str(fake)], create, "tether-42-0-pod", str(step), "1", env)                     # tried again: once
    # made, and its infra container started (outside the rank: the step's processes)
    assert said() == ["pod create --name tether-42-0-pod", "pod start tether-42-0-pod"]
    assert podman.leave_pod("tether-42-0-pod", str(step), "0", env) and len(said()) == 2   # rank 1 is in it
    assert podman.leave_pod("tether-42-0-pod", str(step), "1", env)
    assert said()[2:] == ["pod inspect --format {{.InfraContainerID}} tether-42-0-pod",
                          "pod rm --force --ignore tether-42-0-pod"] and not (step / ".cleanup-pod").exists()
    join_pod([str(fake)], create, "tether-42-0-pod", str(step), "2", env)     # a late rank: a new pod
    assert said()[4:] == ["pod create --name tether-42-0-pod", "pod start tether-42-0-pod"]
    assert (step / ".cleanup-pod").exists()


def test_podman_runs_a_squashfs_image_imported_once_under_a_name_of_its_identity(tmp_path):
    """Issue 45: enroot's and pyxis's image format on podman. A file that is not one, and a FIFO
    named like one, are refused with what podman can run -- never waited on."""
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 92)
    launch = adapter("podman", {"store": ""}).launch(spec(image=str(sqsh), runtime="podman"), HOST)
    name = launch.argv[launch.argv.index("--pull=never") + 1]
    assert name.startswith("localhost/tether-squashfs:") and launch.argv[-3:] == [name, "python", "train.py"]
    (unpack,) = launch.before
    assert callable(unpack[0]) and unpack[2] == f"unpacking the squashfs image {sqsh} into your podman store on this node"
    os.mkfifo(tmp_path / "fifo.sqsh")
    (tmp_path / "text.sqsh").write_text("not a squashfs")
    for bad in ("fifo.sqsh", "text.sqsh"):
        with pytest.raises(LaunchError, match=r"podman runs a rootfs directory, a squashfs image \(\.sqsh\), an image "
                                              r"archive \(oci-archive:PATH\) or a registry image"):
            adapter("podman", {"store": ""}).launch(spec(image=str(tmp_path / bad), runtime="podman"), HOST)


def test_a_squashfs_image_is_unpacked_as_the_user_and_imported_and_a_save_to_sqsh_writes_one(tmp_path, monkeypatch):
    """import_squashfs and save_squashfs with the real squashfs-tools and a stand-in for podman's
    import and export (the cluster test runs them with the real podman)."""
    from tether.container.runtimes import podman as podman_module

    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "marker").write_text("from-the-image\n")
    sqsh = tmp_path / "in.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(sqsh), "-noappend", "-all-root", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    assert podman_module.is_squashfs(str(sqsh))
    fake = tmp_path / "podman"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
        import) cat > {tmp_path}/imported.tar; echo sha256:0 ;;
        export) tar -C {tree} -cf - . ;;
        esac
        """))
    fake.chmod(0o755)
    (tree / "etc" / "shadow").write_text("secret\n")
    (tree / "etc" / "shadow").chmod(0)                       # modes and owners as the image has them
    subprocess.run(["mksquashfs", str(tree), str(sqsh), "-noappend", "-all-root", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    podman_module.import_squashfs(str(sqsh), [str(fake)], "localhost/tether-squashfs:x")
    listing = subprocess.run(["tar", "-tvf", str(tmp_path / "imported.tar")], capture_output=True, text=True).stdout
    rows = {line.split()[-1]: line.split()[:2] for line in listing.splitlines()}
    assert rows["./etc/marker"][1] == "0/0" and rows["./etc/shadow"] == ["----------", "0/0"], listing
    assert not list(tmp_path.glob("**/.tether-squashfs-*"))  # nothing unpacked on the way
    out = tmp_path / "saved.partial"
    podman_module.save_squashfs([str(fake)], "tether-1-0-0", str(out))
    assert out.read_bytes()[:4] == b"hsqs"
    listed = subprocess.run(["unsquashfs", "-lls", str(out)], capture_output=True, text=True).stdout
    assert "squashfs-root/etc/marker" in listed and "---------- " in listed      # shadow's mode kept
    assert listed.splitlines()[0].startswith("drwxr-xr-x"), listed      # a / every user can enter
    # a save to a .sqsh name writes squashfs, to another an OCI archive
    chosen = []
    monkeypatch.setattr(podman_module, "save_squashfs", lambda *a, **kw: chosen.append("squashfs"))
    monkeypatch.setattr(podman_module, "save_oci_archive", lambda *a, **kw: chosen.append("oci"))
    rank_dir = str(tmp_path / "42/n2/step-0/rank-3")
    for name in ("c.sqsh", "c.tar"):
        launch = adapter("podman", {"store": ""}).launch(spec(image="docker://busybox", runtime="podman",
                                                              rank_dir=rank_dir, save=str(tmp_path / name)), HOST)
        launch.finish[0][0]({})
    assert chosen == ["squashfs", "oci"]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(LaunchError, match=r"needs sqfs2tar \(Debian: squashfs-tools-ng\), which is not on this node"):
        podman_module.import_squashfs(str(sqsh), [str(fake)], "n")


def test_an_unreaped_pause_process_is_forgotten_so_podman_starts_a_new_one(tmp_path, capsys):
    """On a node whose PID 1 does not reap (slurmd in a container without an init; this machine),
    a pause process killed with its step stays a zombie, and every later podman of the user fails
    "cannot re-exec process to join the existing user namespace". Only a zombie's pid file goes; a
    live process's, a FIFO's or garbage's stays."""
    from tether.container.runtimes.podman import PAUSE_PID_FILE, Podman

    pid_file = tmp_path / PAUSE_PID_FILE
    pid_file.parent.mkdir(parents=True)
    podman = adapter("podman", {"store": ""})
    assert isinstance(podman, Podman)
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    live = subprocess.Popen(["sleep", "60"])
    zombie = subprocess.Popen(["true"])
    try:
        for _ in range(1000):                                # ended, not reaped (Popen has not waited)
            if open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        else:
            pytest.fail("`true` did not end within 10 s")
        pid_file.write_text(f"{live.pid}\n")
        assert not podman.forget_unreaped_pause_process(env) and pid_file.exists()
        pid_file.write_text("garbage")
        assert not podman.forget_unreaped_pause_process(env) and pid_file.exists()
        pid_file.unlink()
        os.mkfifo(pid_file)
        assert not podman.forget_unreaped_pause_process(env) and pid_file.exists()
        pid_file.unlink()
        pid_file.write_text(f"{zombie.pid}\n")
        assert podman.recover_state(env, "Error: cannot re-exec process to join the existing user namespace")
        assert not pid_file.exists()
        assert f"pause process (pid {zombie.pid}) has ended but nothing reaped it" in capsys.readouterr().err
        assert not podman.forget_unreaped_pause_process({})  # root's podman: no run directory of a user's
    finally:
        live.kill()
        live.wait()
        zombie.wait()


def test_a_writable_container_without_remap_root_runs_a_root_of_the_users_own_unpacked_for_the_step():
    """pyxis's writable container is the user's to write (enroot unpacks the image as the user):
    podman's own writable layer keeps the image's owners, so a --container-writable step of a
    registry image (or a shared rootfs) runs a root unpacked as the user into the step's directory
    on the node, once for the step's ranks there. Read-only, remap-root (root inside writes the
    layer) and the user's own rootfs (an overlay) stay as they were."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tether-test-") as where:    # a path the user can reach
        _writable_plans(Path(where))


def _writable_plans(tmp_path: Path) -> None:
    step = tmp_path / "42/n2/step-0"
    shared = tmp_path / "shared-rootfs"
    for target in ("etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf", "etc/hostname"):
        (shared / target).parent.mkdir(parents=True, exist_ok=True)
        (shared / target).write_text("")
    for target in ("proc", "dev", "sys", "tmp", "run", "mnt", "root"):
        (shared / target).mkdir(exist_ok=True)
    os.chmod(tmp_path, 0o755)
    step.mkdir(parents=True, mode=0o777)

    def plans():
        out = {}
        for key, kw in (("writable", dict(writable=True)), ("readonly", {}),
                        ("remap", dict(writable=True, remap_root=True)), ("shared", dict(writable=True, image=str(shared)))):
            args = {"image": "docker://busybox:1.36", "runtime": "podman", "rank_dir": str(step / "rank-3"), **kw}
            launch = adapter("podman", {"store": ""}).launch(spec(**args), HOST)
            out[key] = (launch.argv, [(b[1] if isinstance(b[1], str) else "", b[2] if len(b) > 2 else
                                       "checked" if "/checked-" in str(b[1]) else "targets") for b in launch.before])
        return out

    got = _as_user(4242, plans)
    assert isinstance(got, dict), got
    own = f"{step}/podman-rootfs"
    argv, before = got["writable"]
    assert argv[-4:] == ["--rootfs", f"{own}/rootfs", "python", "train.py"] and "--read-only" not in argv
    assert argv[argv.index("--env-file") + 1] == f"{own}/image.env"            # the image's ENV first
    # podman's own default store (container.podman.store empty): the job's check, which pulls
    assert [b[-1] for b in before] == ["checked", "unpacking docker://busybox:1.36 as your writable container "
                                                  "(podman; once per node for the step)", "targets"]
    assert before[1][0] == f"{own}/config.json"
    readonly, _ = got["readonly"]
    assert readonly[-3:] == ["docker.io/library/busybox:1.36", "python", "train.py"] and "--read-only" in readonly
    remap, remap_before = got["remap"]
    assert remap[-3:] == ["docker.io/library/busybox:1.36", "python", "train.py"] and "--read-only" not in remap
    assert len(remap_before) == 1                       # the job's check (which pulls)
    argv, before = got["shared"]          # copied as it is, never imported into the store first
    assert argv[-4:] == ["--rootfs", f"{own}/rootfs", "python", "train.py"]
    assert [b[0] for b in before] == [f"{own}/config.json", ""]


def test_a_named_container_another_step_runs_is_attached_to_as_pyxis_does(tmp_path, capsys):
    """pyxis's --container-name=NAME while another step of the job runs it on the node (exec.bats):
    the rank runs in it (``podman exec``, in place: this step's process), found by the cleanup
    markers of the job's other steps and podman's word that it runs -- the earliest step's lowest
    rank's; --container-mounts is ignored with pyxis's words; the working directory is /. NAME
    JOB.STEP: that step's unnamed containers. no_exec never attaches; exec needs one running."""
    node = tmp_path / "42/n2"
    running = {"tether-42-1-0", "tether-42-1-1", "tether-42-3-0"}
    fake = tmp_path / "podman"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {tmp_path}/calls
        for c in {' '.join(sorted(running))}; do
          case "$*" in *"inspect --format {{{{.State.Status}}}} {{{{.State.Pid}}}} $c") echo running {os.getpid()}; exit 0 ;; esac
        done
        case "$*" in *"tether-42-0-0") echo exited 0; exit 0 ;; esac
        case "$*" in *"tether-42-9-0") [ -e {tmp_path}/up ] && {{ echo running {os.getpid()}; exit 0; }} ;; esac
        echo "Error: no such container" >&2; exit 125
        """))
    fake.chmod(0o755)

    def marker(step: str, rank: int, container: str, **extra) -> None:
        (node / step).mkdir(parents=True, exist_ok=True)
        (node / step / f".cleanup-{rank}").write_text(json.dumps({"runtime": "podman", "container": container,
                                                                   **extra}))

    marker("step-1", 1, "tether-42-1-1", name="dev")
    marker("step-1", 0, "tether-42-1-0", name="dev")
    marker("step-0", 0, "tether-42-0-0", name="dev")          # ended: podman says it exited
    marker("step-3", 0, "tether-42-3-0")                      # unnamed
    marker("step-4", 0, "tether-41-4-0", name="dev")          # not this job's name
    marker("step-5", 0, "tether-42-5-0", runtime="enroot", name="dev")
    marker("step-7", 0, "tether-42-7-0", name="dev")          # this step's own sibling: never

    def launch(name: str, **kw):
        return adapter("podman", {"binary": str(fake), "store": ""}).launch(
            spec(**{"image": "", "runtime": "podman", "name": name, "rank_dir": str(node / "step-7/rank-1"), **kw}),
            {**HOST, "TETHER_CONTAINER_MOUNTS": "/data:/data"})

    attached = launch("dev")
    assert not attached.supervise and attached.argv[0] == str(fake)
    at = attached.argv.index("exec")
    (names_fd,) = attached.fds
    assert attached.argv[at:at + 4] == ["exec", "--interactive", "--env-file", f"/dev/fd/{names_fd}"]
    assert attached.argv[-5:] == ["--workdir", "/", "tether-42-1-0", "python", "train.py"]
    assert "ignoring --container-mounts when attaching to a running container" in capsys.readouterr().err
    assert "--volume" not in attached.argv and "TMPDIR=/tmp" not in attached.argv
    assert launch("dev", workdir="/work").argv[-5:-3] == ["--workdir", "/work"]
    assert launch("42.3", name_attach="exec").argv[-3:] == ["tether-42-3-0", "python", "train.py"]
    with pytest.raises(LaunchError, match=r"^--container-name=41.3:exec: no step of this job runs that container"):
        launch("41.3", name_attach="exec")
    with pytest.raises(LaunchError, match=r"^--container-name=dev:exec: no step of this job runs that container"):
        (node / "step-1" / ".cleanup-0").unlink()
        (node / "step-1" / ".cleanup-1").unlink()
        launch("dev", name_attach="exec")
    marker("step-1", 0, "tether-42-1-0", name="dev")
    with pytest.raises(LaunchError, match=r"^--container-unshare=ipc requested but the container is not in a separate "
                                          r"IPC namespace"):       # pyxis's words: it runs in the node's (the
                                                                        # pid: this test's, whose namespaces are ours)
        launch("dev", unshare=("ipc",))
    own = launch("dev", name_attach="never", image="docker://busybox")     # no_exec: a container of its own
    # a step whose launcher wrote its marker but whose container is not up yet: waited for
    import threading

    marker("step-9", 0, "tether-42-9-0", name="late")
    threading.Timer(1.0, lambda: (tmp_path / "up").touch()).start()
    assert launch("late").argv[-3:] == ["tether-42-9-0", "python", "train.py"]
    assert own.supervise and own.argv[1] == "run"


def test_an_enroot_squashfs_images_environment_is_the_images_env_on_podman(tmp_path):
    """An image enroot imported keeps its ENV in /etc/environment (docker::configure), read by
    enroot at each start; podman reads no such file: tether gives its lines as the image's ENV,
    before the job's values (a later --env-file wins), formatted as enroot formats them (comments,
    ill-formed lines and ENROOT_* out, quotes around a whole value off); a line naming a host
    variable is left out (enroot fills it per job). Real squashfs-tools make the image."""
    from tether.container.runtimes.podman import squashfs_environment

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "environment").write_text(
        "PATH=/opt/conda/bin:/usr/bin:/bin\n# a comment\nCUDA_VERSION=\"12.4\"\n  LANGUAGE=en\nENROOT_X=1\n"
        "not a line\nLD_X=${HOME}/lib\nEMPTY=\n")
    sqsh = tmp_path / "img.sqsh"
    subprocess.run(["mksquashfs", str(root), str(sqsh), "-quiet", "-no-progress", "-all-root"], check=True,
                   capture_output=True, timeout=120)
    lines = ["PATH=/opt/conda/bin:/usr/bin:/bin", "CUDA_VERSION=12.4", "LANGUAGE=en", "EMPTY="]
    assert squashfs_environment(str(sqsh)) == lines
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    rank_dir.mkdir(parents=True)
    argv = adapter("podman", {"store": ""}).launch(spec(image=str(sqsh), runtime="podman", rank_dir=str(rank_dir)),
                                                   HOST).argv
    files = [argv[i + 1] for i, a in enumerate(argv) if a == "--env-file"]
    assert files[0] == f"{rank_dir}/.image-env" and files[1].startswith("/dev/fd/")
    assert (rank_dir / ".image-env").read_text() == "".join(f"{line}\n" for line in lines)
    assert oct((rank_dir / ".image-env").stat().st_mode & 0o777) == "0o600"
    empty = tmp_path / "empty"
    (empty / "etc").mkdir(parents=True)
    bare = tmp_path / "bare.sqsh"
    subprocess.run(["mksquashfs", str(empty), str(bare), "-quiet", "-no-progress"], check=True, capture_output=True,
                   timeout=120)
    assert squashfs_environment(str(bare)) == []


def test_a_root_unpacked_as_the_user_keeps_the_images_modes_and_skips_what_the_user_cannot_read(capfd):
    """unpack_named's copy of a shared rootfs (a writable or named container): the image's modes,
    not the user's umask (a 0755 /usr stays so under umask 077); a file only root may read (a
    root-extracted /etc/shadow) is left out and counted, not a failed step."""
    import tempfile

    from tether.container.runtimes.podman import unpack_named

    with tempfile.TemporaryDirectory(prefix="tether-test-") as where:
        base = Path(where)
        os.chmod(base, 0o755)
        image = base / "image"
        (image / "usr" / "bin").mkdir(parents=True)
        (image / "usr" / "bin" / "tool").write_text("#!/bin/sh\n")
        os.chmod(image / "usr" / "bin" / "tool", 0o755)
        (image / "etc").mkdir()
        (image / "etc" / "shadow").write_text("secret\n")
        os.chmod(image / "etc" / "shadow", 0o600)
        for d in (image, image / "usr", image / "usr" / "bin", image / "etc"):
            os.chmod(d, 0o755)
        home = base / "home"
        home.mkdir()
        os.chown(home, 4242, 4242)

        def unpack():
            os.umask(0o077)
            unpack_named(["--rootfs", str(image)], ["podman"], str(home))
            root = home / "rootfs"
            return (oct(os.stat(root / "usr").st_mode & 0o777), oct(os.stat(root / "usr/bin/tool").st_mode & 0o777),
                    (root / "etc" / "shadow").exists())

        assert _as_user(4242, unpack) == ("0o755", "0o755", False)
    assert "1 file(s) of" in capfd.readouterr().err


def test_an_enroot_images_environment_file_is_read_as_enroot_reads_it_and_never_through_a_link(tmp_path):
    """An enroot squashfs keeps its image's ENV in /etc/environment: comments, ill-formed lines,
    ENROOT_* and lines naming a host variable go, quotes around a value go. Read from a root the
    user unpacked, a link or a FIFO there gives nothing (the image's, not a file of the host's)."""
    from tether.container.runtimes.podman import _read_no_follow, environment_lines

    text = "# c\nPATH=/usr/bin\n  LANG='C.UTF-8'\nENROOT_X=1\nHOME=${HOME}\nnot a line\nA=\"b c\"\n"
    assert environment_lines(text) == ["PATH=/usr/bin", "LANG=C.UTF-8", "A=b c"]
    (tmp_path / "environment").write_text(text)
    (tmp_path / "link").symlink_to(tmp_path / "environment")
    os.mkfifo(tmp_path / "fifo")
    assert _read_no_follow(str(tmp_path / "environment")) == text
    assert _read_no_follow(str(tmp_path / "link")) == "" and _read_no_follow(str(tmp_path / "fifo")) == ""


def test_mount_targets_are_made_in_a_users_own_root_before_its_ranks_start_and_never_through_a_link(tmp_path):
    """The ranks sharing a root the user unpacked (a named or writable container) would each make
    the step's missing mount targets at once, and runc's mkdir of a parent another rank just made
    fails ("file exists", seen on Slurm 24.11's podman 5): they are made once, before, under the
    launch's lock -- inside the root only: a link of the image's is not followed out of it."""
    from tether.container.runtimes.podman import make_targets

    root = tmp_path / "rootfs"
    (root / "run").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file").write_text("")
    make_targets(str(root), ["/run/tether/workdir", "/tmp", "/link/x", "/file/y", "/a/../../escape"])
    assert (root / "run/tether/workdir").is_dir() and (root / "tmp").is_dir()
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists()
    make_targets(str(root), ["/run/tether/workdir"])                               # again: nothing to do
    make_targets(str(tmp_path / "nosuch"), ["/tmp"])                               # no root: the runtime says
    podman = adapter("podman", {"store": ""})
    launch = podman.launch(spec(image="docker://busybox", runtime="podman", name="dev", writable=True), HOST)
    unpack, targets = launch.before[-2:]
    assert unpack[2].startswith("unpacking") and callable(targets[0]) and targets[1] is None


def test_a_workdir_the_users_own_root_lacks_is_refused_in_pyxis_words(tmp_path):
    """pyxis's workdir.bats "target doesn't exist": `--container-workdir=/pyxis` on an image without
    it fails the rank with ".../pyxis: No such file or directory" (podman's own message named a
    container id). A mount target, a directory the image has, or a link of the image's (resolved
    inside the container by the runtime) are not refused; nothing is followed out of the root."""
    from tether.container.runtimes.podman import missing_directory

    root = tmp_path / "rootfs"
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)
    assert missing_directory(str(root), "/pyxis") == "/pyxis"
    assert missing_directory(str(root), "/usr/nosuch/deeper") == "/usr/nosuch"
    assert missing_directory(str(root), "/usr/local/bin") is None
    assert missing_directory(str(root), "/link/rootfs") is None
    assert missing_directory(str(tmp_path / "nosuch"), "/x") is None
    podman = adapter("podman", {"store": ""})

    def prepared(**kw) -> list[str]:
        launch = podman.launch(spec(image="docker://busybox", runtime="podman", name="dev", writable=True,
                                    rank_dir=str(tmp_path / "42/n2/step-0/rank-3"), **kw), HOST)
        os.makedirs(launch.argv[launch.argv.index("--rootfs") + 1] + "/usr/local/bin", exist_ok=True)
        return launch.prepare(launch.argv)

    assert prepared(workdir="/usr/local/bin")[-2:] == ["python", "train.py"]
    with pytest.raises(LaunchError, match="couldn't chdir to /pyxis: No such file or directory"):
        prepared(workdir="/pyxis")
    prepared(workdir="/data/run", mounts=(Mount(str(tmp_path), "/data"),))     # a mount's target: made


def test_a_pod_whose_infra_conmon_was_killed_is_removed_on_the_second_try(tmp_path):
    """At a step's end with killed ranks, podman's first `pod rm --force` only marks the infra
    container (its conmon killed) stopped and fails ("could not be stopped: timed out"); the
    second removes the pod, and runc's own state of the infra container, which podman leaves,
    goes too (seen on podman 4.3 in the sandbox: the pod stayed after the step's cleanup)."""
    infra = "ab" * 32
    calls, tries = tmp_path / "calls", tmp_path / "tries"
    fake = tmp_path / "podman"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "podman $*" >> {calls}
        case "$*" in
          *"pod inspect"*) echo {infra} ;;
          *"pod rm"*) if [ ! -e {tries} ]; then touch {tries}
                      echo 'Error: cannot remove container {infra} as it could not be stopped: timed out' >&2; exit 125
                      fi ;;
        esac
        """))
    fake.chmod(0o755)
    runc = tmp_path / "runc"
    runc.write_text(f"#!/bin/sh\necho \"runc $*\" >> {calls}\n")
    runc.chmod(0o755)
    run_dir = tmp_path / "xdg"
    (run_dir / "runc" / infra).mkdir(parents=True)
    podman = adapter("podman", {"store": "", "binary": str(fake), "args": ["--runtime", str(runc)],
                                "env": {"XDG_RUNTIME_DIR": str(run_dir)}})
    assert podman.remove_pod("tether-7-0-pod", {**os.environ, "XDG_RUNTIME_DIR": str(run_dir)})
    said = calls.read_text().splitlines()
    assert [line for line in said if " pod rm " in line] == [
        f"podman --runtime {runc} pod rm --force --ignore tether-7-0-pod"] * 2, said
    assert said[-1] == f"runc --root {run_dir}/runc delete --force {infra}", said


def test_with_the_entrypoint_the_jobs_other_variables_follow_it(tmp_path, monkeypatch):
    """--container-entrypoint (pyxis): the image's entrypoint starts without the job's variables
    outside the allowlist and --container-env; a shell between it and the command sets them where
    the entrypoint left them unset -- on a registry image and before a named container's own
    ENTRYPOINT alike."""
    from tether.container.runtimes import LATER_FILE, LATER_PART

    monkeypatch.setattr("tether.container.runtimes.podman.stdio_is_terminal", lambda: False)
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    podman = adapter("podman", {"store": ""})
    plain = podman.launch(spec(image="docker://busybox", runtime="podman", rank_dir=str(rank_dir)), HOST)
    assert plain.argv[-2:] == ["python", "train.py"] and {"MYVAR", "OTHER"} <= env_file_names(plain)
    asked = podman.launch(spec(image="docker://busybox", runtime="podman", rank_dir=str(rank_dir), entrypoint=True,
                               env_names=("OTHER",)), HOST)
    shell = ["/bin/sh", "-c", LATER_PART + 'exec "$@"', "sh", f"{CONTAINER_WORKDIR}/{LATER_FILE}", "python", "train.py"]
    assert asked.argv[-len(shell):] == shell and "--entrypoint=" not in asked.argv
    names = env_file_names(asked)
    assert "MYVAR" not in names and {"OTHER", "RANK", "SLURM_JOB_ID"} <= names
    assert "export MYVAR=" in (rank_dir / "work" / LATER_FILE).read_text()
    rootfs = tmp_path / "rootfs"                  # a rootfs directory has no entrypoint: all at once
    rootfs.mkdir()
    direct = podman.launch(spec(image=str(rootfs), runtime="podman", rank_dir=str(rank_dir), entrypoint=True), HOST)
    assert direct.argv[-2:] == ["python", "train.py"] and "/bin/sh" not in direct.argv
    assert "MYVAR" in env_file_names(direct)
    named = podman.launch(spec(image="docker://busybox", runtime="podman", name="dev", rank_dir=str(rank_dir),
                               entrypoint=True), HOST)
    home = tmp_path / "42/n2/podman-named/dev"
    home.mkdir(parents=True)
    (home / "config.json").write_text('{"Entrypoint": ["/entry.sh"]}')
    assert named.prepare(named.argv)[-len(shell) - 3:] == ["--rootfs", f"{home}/rootfs", "/entry.sh", *shell]

"""The launch spec (tether.container.spec) without a cluster: a spec from the task's environment, the
container options checked at submit with the run side's messages, image references, the on/off pairs
and the admin's defaults, --container-save/-name/-unshare as read from the task.
"""

from __future__ import annotations

import os

import pytest

from tether.container.environment import passed_from_host
from tether.container.runtimes import adapter
from tether.container.spec import CONTAINER_WORKDIR, LaunchError, Mount, check_container_options, spec_from_env

from container_helpers import HOST, spec


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
    # pyxis's --container-readonly (the default of podman and Apptainer); with --container-writable, a contradiction
    check_container_options({"container-image": "/i", "container-readonly": "1"}, "podman")
    with pytest.raises(LaunchError, match="--container-writable and --container-readonly ask for opposite"):
        check_container_options({"container-image": "/i", "container-readonly": "1", "container-writable": "1"},
                                "podman")
    assert not spec_from_env({"TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_READONLY": "1"}, ["c"],
                             default_runtime="podman").writable


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


@pytest.mark.parametrize("text,hint", [("img.sif", "its path, absolute or starting with ./"),
                                       ("Ubuntu:22.04", "lowercase"), ("a b", "")])
def test_a_bad_image_is_refused_at_submit_naming_the_accepted_forms(text, hint):
    """Issue 14: `--container-image=ubuntu:22.04` was refused (and only on the node); a bad one is
    now refused wherever it is given, with the forms tether accepts."""
    with pytest.raises(LaunchError) as info:
        check_container_options({"container-image": text}, "podman")
    assert "expected a path" in str(info.value) and "ubuntu:22.04" in str(info.value)
    assert hint in str(info.value)
    check_container_options({"container-image": "ubuntu:22.04"}, "podman")      # accepted
    check_container_options({"container-image": "nvcr.io#nvidia/pytorch:24.01-py3"}, "enroot")


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
    # nothing to unpack: only the step's mount targets, made in the root before the ranks start
    assert [b[1] for b in launch.before] == [None] and launch.argv[-4:] == ["--rootfs", f"{home}/rootfs", "python",
                                                                           "train.py"]
    assert f"{home}/image.env" in launch.argv
    enroot_alone = spec(image="", runtime="enroot", name="dev", rank_dir=rank_dir)
    with pytest.raises(LaunchError, match=r"^--container-name=dev: this job's container dev on this node was made "
                                          r"with podman, and this step runs enroot: add --container-runtime=podman"):
        adapter("enroot", {}).launch(enroot_alone, HOST)      # podman made "dev" (above): said so (issue 45)
    (tmp_path / "42/n2/enroot/data/tether-42-dev").mkdir(parents=True)        # where enroot create put it
    launch = adapter("enroot", {}).launch(enroot_alone, HOST)
    # nothing to make; only the start turn the job's ranks take at its root
    assert [b[1] for b in launch.before] == [None] and "tether-42-dev" in launch.argv and launch.after == []
    with pytest.raises(LaunchError, match="apptainer keeps no container between steps"):
        adapter("apptainer", {}).launch(spec(image="", runtime="apptainer", name="dev", rank_dir=rank_dir), HOST)


def test_pyxis_container_name_flags_auto_no_exec_create_and_exec(tmp_path):
    """pyxis's --container-name=NAME:FLAG. auto: attach to it while another step runs it, else the
    job's container, made when missing; no_exec: never attach; exec: attach only; create: this step
    makes it -- its other ranks find the one its first rank made, a later step is refused."""
    for flag, attach in (("", "auto"), (":auto", "auto"), (":no_exec", "never"), (":exec", "exec")):
        s = spec_from_env({"TETHER_CONTAINER_NAME": f"dev{flag}", "TETHER_CONTAINER_IMAGE": "busybox"}, ["cmd"],
                          default_runtime="podman")
        assert (s.name, s.name_create, s.name_attach) == ("dev", False, attach)
    made = spec_from_env({"TETHER_CONTAINER_NAME": "dev:create", "TETHER_CONTAINER_IMAGE": "busybox"}, ["cmd"],
                         default_runtime="podman")
    assert (made.name_create, made.name_attach) == (True, "never")
    with pytest.raises(LaunchError, match="FLAG is one of auto, no_exec, exec, create"):
        spec_from_env({"TETHER_CONTAINER_NAME": "dev:later"}, ["cmd"], default_runtime="podman")
    home = tmp_path / "42/n2/podman-named/dev"

    def podman(step: str, **kw):
        return adapter("podman", {"store": ""}).launch(
            spec(image="docker://busybox", runtime="podman", name="dev", name_create=True,
                 rank_dir=str(tmp_path / f"42/n2/{step}/rank-3"), **kw), HOST)

    first = podman("step-1")                          # none yet: this step unpacks it, and says so first
    assert first.before[-2][1] == f"{home}/config.json"
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
    create, data = launch.before[-2][0], launch.before[-2][1]        # [-1]: the start turn
    assert callable(create) and data == str(tmp_path / "42/n2/enroot/data/tether-42-box")
    os.makedirs(data)
    (tmp_path / "42/n2/enroot/made-by-tether-42-box").write_text("step-3\n")
    with pytest.raises(LaunchError, match="--container-name=box:create: this job already has"):
        adapter("enroot", {}).launch(enroot_spec, HOST)
    (tmp_path / "42/n2/enroot/made-by-tether-42-box").write_text("step-4\n")
    assert adapter("enroot", {}).launch(enroot_spec, HOST).argv


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


def test_an_unshare_value_longer_than_any_option_value_is_refused_by_python_as_by_c():
    """spank/options.c refuses a --container-unshare value over TETHER_MAX_TEXT bytes; the Python
    twin accepted "net,net,..." of any length (a hostile review's finding)."""
    from tether.hooks.surface import MAX_TEXT, OPTIONS, normalize

    opt = next(o for o in OPTIONS if o.name == "container-unshare")
    fits = ",".join(["net"] * (MAX_TEXT // 4))
    assert len(fits) <= MAX_TEXT and normalize(opt, fits) == fits
    too_long = ",".join(["net"] * (MAX_TEXT // 4 + 2))
    assert len(too_long) > MAX_TEXT and normalize(opt, too_long) is None


def test_a_relative_image_is_pyxiss_path_from_the_working_directory_resolved_by_the_launcher(tmp_path):
    """pyxis's --container-image=./ubuntu.sqsh (squashfs_image.bats): accepted at submit as a path,
    resolved by the launcher against the step's working directory on the node -- never in one
    others can write (another user may have put ./ubuntu.sqsh there first)."""
    from tether.container.spec import resolve_image

    check_container_options({"container-image": "./ubuntu.sqsh"}, "podman")        # accepted at submit
    check_container_options({"container-image": "../images/x.sif"}, "apptainer")
    work = tmp_path / "work"
    work.mkdir()
    assert resolve_image("./ubuntu.sqsh", str(work)) == f"{work}/ubuntu.sqsh"
    assert resolve_image("../x.sif", str(work)) == f"{tmp_path}/x.sif"
    made = spec_from_env({"TETHER_CONTAINER_IMAGE": "./ubuntu.sqsh"}, ["true"], default_runtime="podman",
                         resolve=False)
    assert made.image == "./ubuntu.sqsh"                                            # not at submit
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(LaunchError, match=r"a relative image in .*shared, a directory others can write"):
        resolve_image("./ubuntu.sqsh", str(shared))


def test_both_batch_flags_at_once_are_refused_at_submit():
    """--container-batch with --no-container-batch: refused as the other pairs are (the SPANK
    plugin would have let the first win)."""
    from tether.container.spec import check_container_options

    with pytest.raises(LaunchError, match="--container-batch and --no-container-batch ask for opposite things"):
        check_container_options({"container-image": "/i", "container-batch": "1", "no-container-batch": "1"},
                                "podman")
    check_container_options({"container-image": "/i", "no-container-batch": "1"}, "podman")

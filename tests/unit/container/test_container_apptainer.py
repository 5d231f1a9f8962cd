"""The Apptainer and Singularity adapters (tether.container.runtimes.apptainer, .singularity): exact argv
and environment, and `tether run` executing them in place through the fake runtimes.
"""

from __future__ import annotations

import os

import pytest

from tether.container.runtimes import adapter
from tether.container.spec import CONTAINER_WORKDIR, LaunchError, Mount, spec_from_env

from container_helpers import HOST, _tether_run, spec


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


# ---- the cluster image store (issue 44) ---------------------------------------------------------
def _store_with_image(tmp_path, image_id: str, *, form: bytes | None):
    """A store of this process's uid with one image and, when ``form`` is given, its Apptainer form."""
    from tether.container.imagestore import ImageStore

    store = ImageStore(str(tmp_path / "store"), os.getuid())
    store.setup()
    images = tmp_path / "store" / "images"
    (images / f"{image_id}.sqfs").write_bytes(b"hsqs" + bytes(16) + (6).to_bytes(2, "little") + bytes(74))
    if form is not None:
        (images / f"{image_id}.apptainer.sqfs").write_bytes(form)
    for path in images.iterdir():
        path.chmod(0o444)
    return store


def test_an_apptainer_rank_starts_the_stores_apptainer_form_as_it_is(tmp_path, monkeypatch, capsys):
    """A registry image the cluster store holds: Apptainer starts the store's gzip form itself (no
    build, nothing in the image cache); the job's variables still go in as APPTAINERENV_* (which
    Apptainer puts in after the form's 99-base.sh, over the image's ENV). Singularity, the image's
    entrypoint and ``user@`` references convert as before (the store is not asked); a store
    without the form says so and converts; a damaged form fails the rank clearly."""
    from tether.container.imagestore import Published
    from tether.container.runtimes import Runtime

    image_id = "ab" * 32
    gzip_form = b"hsqs" + bytes(16) + (1).to_bytes(2, "little") + bytes(74)
    store = _store_with_image(tmp_path, image_id, form=gzip_form)
    asked = []

    def store_image(self, name):
        asked.append(name)
        return Published(name, image_id, "sha256:" + "e" * 64, store.image_path(image_id), 0.0, {"env": []})

    monkeypatch.setattr(Runtime, "cluster_store_image", store_image)
    monkeypatch.setattr("tether.container.imagestore.ImageStore.configured", classmethod(lambda cls, s: store))
    built = []
    monkeypatch.setattr("tether.container.images.ImageCache.ensure", lambda self, *a, **k: built.append(a) or "/c.sif")
    settings = {"root": store.root}
    s = spec(image="docker.io/library/ubuntu:22.04", env_names=("MYVAR",))
    launch = adapter("apptainer", {}, cluster_store=settings).launch(s, HOST)
    form = os.path.join(store.root, "images", f"{image_id}.apptainer.sqfs")
    assert asked == ["docker.io/library/ubuntu:22.04"] and built == []
    assert launch.argv[launch.argv.index(form) + 1:] == ["python", "train.py"]
    assert launch.env["APPTAINERENV_MYVAR"] == HOST["MYVAR"]
    for runtime, kw in (("singularity", {}), ("apptainer", {"entrypoint": True}),
                        ("apptainer", {"image": "alice@docker.io#library/ubuntu:22.04"})):
        asked.clear()
        built.clear()
        other = adapter(runtime, {}, cluster_store=settings).launch(spec(**{"image": s.image, **kw}), HOST)
        assert asked == [] and form not in other.argv and len(built) == 1, (runtime, kw)
    off = adapter("apptainer", {}, cluster_store={**settings, "apptainer_form": False}).launch(s, HOST)
    assert form not in off.argv
    # published before apptainer_form was on: said, and converted as without the store
    os.chmod(store.root + "/images", 0o755)
    os.unlink(form)
    built.clear()
    capsys.readouterr()
    missing = adapter("apptainer", {}, cluster_store=settings).launch(s, HOST)
    assert form not in missing.argv and len(built) == 1
    assert "has no Apptainer image of docker.io/library/ubuntu:22.04" in capsys.readouterr().err
    # a form with zstd (or damaged) is never handed to Apptainer, which would refuse it
    (tmp_path / "store" / "images" / f"{image_id}.apptainer.sqfs").write_bytes(
        b"hsqs" + bytes(16) + (6).to_bytes(2, "little") + bytes(74))
    with pytest.raises(LaunchError, match="not compressed with compressor 1"):
        adapter("apptainer", {}, cluster_store=settings).launch(s, HOST)


APPTAINER_SQUASHFS_CASES = ("exec-img-true", "exec-img-gz-true", "exec-img-gz-exit7", "exec-img-gz-nosuchcmd",
                            "store-form-cleanenv-job-variable-wins", "store-form-cleanenv-host-variable-loses",
                            "store-form-host-variable-loses", "store-form-prepend-path")
# what the fake does not model: Apptainer's own variables and the shell's prompt command
NOT_MODELLED = ("APPTAINER_", "SINGULARITY_", "PROMPT_COMMAND=", "USER_PATH=")


def test_the_fake_apptainer_replays_real_apptainers_start_of_squashfs_files(public_dir):
    """What real Apptainer 1.1.9, built from its sources on this project's machine, did with
    squashfs image files (tests/fixtures/conformance/apptainer-squashfs.json): a zstd one refused
    before anything runs, a gzip one run (exit status, a missing command, the fuse2fs line), and
    the store's Apptainer form as the image service writes it (write_apptainer_form, real
    sqfs2tar and tar2sqfs): the image's ENV, the job's APPTAINERENV_ values over it, a host
    variable under it, PREPEND_PATH."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    from tether.container.imageservice import write_apptainer_form
    from tether.testing.runtimes import FakeRuntimes

    recorded = json.loads((Path(__file__).parents[2] / "fixtures/conformance/apptainer-squashfs.json").read_text())
    cases = {c["id"]: c for c in recorded["cases"]}
    fakes = FakeRuntimes(public_dir / "fakes", apptainer="apptainer-1")
    fakes.configure(run=True)
    tree = public_dir / "tree"
    (tree / "bin").mkdir(parents=True)
    zstd, gz, form = public_dir / "img.sqfs", public_dir / "img-gz.sqfs", public_dir / "form.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(zstd), "-quiet", "-noappend", "-no-progress", "-comp", "zstd"],
                   check=True)
    subprocess.run(["mksquashfs", str(tree), str(gz), "-quiet", "-noappend", "-no-progress", "-comp", "gzip"],
                   check=True)
    write_apptainer_form(str(zstd), str(form), recorded["image_env"], environ=dict(os.environ))
    home = public_dir / "home"
    home.mkdir()
    places = {"<IMG_GZ>": str(gz), "<IMG>": str(zstd), "<FORM>": str(form), "<HOME>": str(home)}

    def fill(text: str) -> str:
        for key, value in places.items():
            text = text.replace(key, value)
        return text

    fuse2fs = shutil.which("fuse2fs", path="/usr/sbin:/usr/bin:/sbin:/bin")
    for key in APPTAINER_SQUASHFS_CASES:
        case = cases[key]
        env = {k: fill(v) for k, v in case["env"].items()}
        env["PATH"] = fakes.path_env("/usr/bin:/bin")
        ran = subprocess.run([str(fakes.bin_dir / "apptainer"), *[fill(a) for a in case["argv"][1:]]],
                             env={**env, "HOME": str(home)}, capture_output=True, text=True, cwd=str(public_dir),
                             timeout=60)
        expected = fill(case["stderr"])
        if fuse2fs:                     # the INFO line is said only where fuse2fs is missing
            expected = expected.replace("INFO:    fuse2fs not found, will not be able to mount EXT3 filesystems\n", "")
        assert (ran.returncode, ran.stderr) == (case["exit_code"], expected), key
        if case["argv"][-1] == "env":
            # LC_CTYPE: the fake is Python, which sets it in a C locale (PEP 538) and passes it on
            shown = sorted(line for line in ran.stdout.splitlines() if not line.startswith(("PWD=", "HOME=",
                                                                                            "LC_CTYPE=")))
            wanted = sorted(line for line in fill(case["stdout"]).splitlines()
                            if not line.startswith((*NOT_MODELLED, "PWD=", "HOME=")))
            assert shown == wanted, key

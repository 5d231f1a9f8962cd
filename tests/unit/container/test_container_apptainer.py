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

"""`tether run` (tether.container.run) end to end through the testing kit's fake runtime executables,
which record their argv and environment (Apptainer, Singularity and Enroot are not installable here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.container.runtimes import adapter, available
from tether.container.spec import LaunchError, parse_mounts

from container_helpers import HOST, _tether_run, conf_printed, spec


def test_every_configured_runtime_has_an_adapter():
    from tether.hooks.config import RUNTIMES

    assert set(RUNTIMES) <= set(available())
    with pytest.raises(LaunchError, match="unknown container runtime"):
        adapter("docker", {})


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
        125, "tether: --container-mounts: /no/such/dir: source path does not exist on this node\n")
    assert fake_runtimes.calls() == []                           # the runtime never ran
    site = tmp_path / "site.yaml"
    site.write_text(runtime_config.read_text().replace("container: {", "container: {mounts: ['/no/site:/site'], "))
    proc = _tether_run(tmp_path, fake_runtimes, site, *common, "--", "true")
    assert proc.returncode == 125 and \
        "tether: container.mounts in tether's config: /no/site: source path does not exist on this node" in proc.stderr
    assert fake_runtimes.calls() == []
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=apptainer",
                       f"--container-image={image}", f"--container-mounts={there}:/d", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert f"{there}:/d" in fake_runtimes.calls("apptainer")[0]["argv"]


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
    plain_rc = conf_printed(e_plain.argv[e_plain.argv.index("--conf") + 1], "rc")     # (the next launch rewrites it)
    e_asked = enroot.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), entrypoint=True,
                                 remap_root=False, mounts=parse_mounts("/a:/b:nosuid")), HOST)
    assert plain_rc == ['    exec "$@"'] and "ENROOT_REMAP_ROOT" not in e_plain.env  # enroot's config decides
    conf = e_asked.argv[e_asked.argv.index("--conf") + 1]
    assert conf_printed(conf, "rc") is None and e_asked.env["ENROOT_REMAP_ROOT"] == "n"  # the image's /etc/rc
    assert "/a /b none x-create=auto,rbind,nosuid" in conf_printed(conf, "mounts")
    podman = adapter("podman", {"store": ""})
    p_plain = podman.launch(spec(image="docker://busybox", runtime="podman"), HOST).argv
    p_asked = podman.launch(spec(image="docker://busybox", runtime="podman", entrypoint=True, remap_root=True), HOST).argv
    assert "--entrypoint=" in p_plain and "--entrypoint=" not in p_asked
    if os.getuid() != 0:
        assert "--userns=keep-id" in p_plain
    assert "--userns=keep-id" not in p_asked                       # rootless podman's root: still you outside


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

"""The Enroot adapter (tether.container.runtimes.enroot): import, create, start and remove, its
environment file, and `tether run` through the fake enroot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tether.container.images import image_key
from tether.container.runtimes import adapter
from tether.container.runtimes.enroot import (CD_PROLOGUE, CREATE_QUIET_SECONDS, STARTED_PROLOGUE, VALUES_DIR, VALUES_PART, VALUES_PROLOGUE,
                                              enroot_uri)
from tether.container.spec import CONTAINER_WORKDIR, LaunchError, Mount

from container_helpers import HOST, _tether_run, conf_printed, spec


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
    (digest, importing, finishing, marking, creating, turn) = launch.before
    assert callable(turn[0]) and turn[1] is None              # the ranks start the shared root in turn
    assert callable(digest[0]) and digest[1] == sqsh          # the tag's digest, read before the import
    assert callable(marking[0]) and marking[1] == f"{tmp_path}/42/n2/enroot/checked-" + image_key(enroot_uri(s.image))[:16]
    assert importing == (["enroot", "import", "--output", partial, "docker://nvcr.io#nvidia/pytorch:24.01-py3"], sqsh,
                         f"importing {s.image} (enroot)", f"failed to import docker image: {s.image}")
    assert launch.failures == str(node)                       # the step's other ranks here: no second try
    assert callable(finishing[0]) and finishing[1] == sqsh       # renamed into place only once complete
    # one container root per node for the step, shared by its ranks there (as pyxis's tasks share
    # theirs): made whole under a name of its own, renamed into place (see the fp test below)
    assert callable(creating[0]) and creating[1:] == (
        f"{node}/enroot/data/tether-42.0", f"unpacking the container root of {s.image} (enroot create)",
        f"failed to unpack the container root of {s.image} (enroot create)", CREATE_QUIET_SECONDS)
    assert launch.lock == f"{store}/.import-lock"             # the user's ranks and jobs on the node
    assert os.stat(store).st_mode & 0o777 == 0o700
    per_step = adapter("enroot", {"store": ""}).launch(s, HOST)         # no store: per step, as before
    assert per_step.before[0][1] == f"{node}/enroot/{image_key(enroot_uri(s.image))[:24]}.sqsh"
    assert per_step.lock == f"{node}/enroot/.import-lock"
    argv = launch.argv
    conf = f"{node}/enroot/environ-3.conf"
    assert argv[:5] == ["enroot", "start", "--rw", "--conf", conf]
    # --no-container-entrypoint (the default): the command itself, the conf's rc() (no --rc file:
    # enroot's realpath and cp of it are two processes more)
    assert "--rc" not in argv and conf_printed(conf, "rc") == ['    exec "$@"']
    assert "--env" not in argv          # enroot start runs an awk per --env: tether's own values are in the conf
    assert HOST["MYVAR"] not in " ".join(argv) and oct(os.stat(conf).st_mode & 0o777) == "0o600"
    text = Path(conf).read_text()
    assert "cat" not in text            # printf, a builtin: a here-document costs a cat process
    environ = conf_printed(conf, "environ")
    # last, so they win over the job's (as --env did), the nvidia hook's variable among them
    assert environ[-4:] == ["TETHER_CONTAINER=1", "TMPDIR=/tmp", "TETHER_WORK_DIR=/run/tether/workdir",
                            "NVIDIA_VISIBLE_DEVICES=all"], environ
    assert "OTHER=no" in environ and "RANK=3" in environ and not any(e.startswith("PATH=") for e in environ)
    assert "MYVAR" not in text                      # a line break: enroot's file cannot carry it ...
    assert Path(s.rank_dir, "work", VALUES_DIR, "MYVAR").read_text() == HOST["MYVAR"]     # ... the command reads it
    assert "--mount" not in argv                    # mounts: in the conf's mounts()
    assert conf_printed(conf, "mounts")[:3] == [
        f"{s.rank_dir}/tmp /tmp none x-create=dir,bind",
        f"{s.rank_dir}/work /run/tether/workdir none x-create=dir,bind", "/data /data none x-create=auto,rbind,ro"]
    assert argv[-9:] == ["tether-42.0", "/bin/sh", "-c", STARTED_PROLOGUE + VALUES_PROLOGUE, "sh",
                         f"{CONTAINER_WORKDIR}/{VALUES_DIR}", CONTAINER_WORKDIR, "python", "train.py"]
    # the command's shell says it started, in the rank's work directory: enroot failing before is told apart
    assert STARTED_PROLOGUE == ': > "/run/tether/workdir/.tether-started" 2>/dev/null; '
    assert launch.created == f"{s.rank_dir}/work/.tether-started"
    assert VALUES_PROLOGUE.endswith(CD_PROLOGUE) and 'exit 125; }; shift; exec "$@"' in CD_PROLOGUE
    assert launch.after == []                   # the shared root goes with the step's directory
    saving = adapter("enroot", {}).launch(spec(image="docker://busybox", runtime="enroot", save="/x.sqsh",
                                               rank_dir=s.rank_dir), HOST)
    assert saving.after == [["enroot", "remove", "--force", "tether-42-0-3"]]    # saves its own: a root per rank
    named = adapter("enroot", {}).launch(spec(image="docker://busybox", runtime="enroot", name="dev",
                                              rank_dir=s.rank_dir), HOST)
    assert named.after == [] and "tether-42-dev" in named.argv
    assert named.env["ENROOT_DATA_PATH"] == f"{tmp_path}/42/n2/enroot/data"   # kept for the job's steps
    assert enroot_uri("docker://busybox:1.36") == "docker://busybox:1.36"
    assert enroot_uri("docker://localhost:5000/a/b") == "docker://localhost:5000#a/b"


def test_tether_run_enroot_sequence_and_exit_code(tmp_path, fake_runtimes, runtime_config):
    fake_runtimes.configure(exit_code=4)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true")
    assert proc.returncode == 4, proc.stderr
    assert "tether: importing docker://busybox (enroot) ...\n" in proc.stderr      # what happens, said
    assert "tether: importing docker://busybox (enroot): done in " in proc.stderr
    calls = fake_runtimes.calls("enroot")
    # the tag's digest (kept with the import), the import, the step's root; the root goes with the step
    assert [c["argv"][1] for c in calls] == ["digest", "import", "create", "start"]
    (started,) = fake_runtimes.calls("enroot-container")
    assert started["command"][-3:] == ["sh", CONTAINER_WORKDIR, "true"] and started["container_env"]["RANK"] == "1"
    step = tmp_path / "7/n1/step-2"
    assert calls[3]["paths"]["ENROOT_DATA_PATH"] == str(step / "enroot/data")
    assert calls[3]["paths"]["ENROOT_RUNTIME_PATH"] == str(step / "enroot/run")
    # a second rank of the step on the node starts in the same root: no second import, no create
    fake_runtimes.configure(exit_code=0)
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true", rank_dir=step / "rank-0", RANK="0")
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][4:] == ["start"]
    assert [c["container"] for c in fake_runtimes.calls("enroot-container")] == ["tether-7.2"] * 2
    # nor does another job's step on this node: the image is in the user's store (issue 14), its
    # tag checked against the registry once for the job (unchanged: nothing imported, nothing said)
    other = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                        "--container-image=docker://busybox", "--", "true", rank_dir=tmp_path / "8/n1/step-0/rank-0",
                        SLURM_JOB_ID="8", SLURM_STEP_ID="0")
    assert other.returncode == 0, other.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][5:] == ["digest", "create", "start"]
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")].count("import") == 1 and "registry" not in other.stderr
    # the tag pushed again: the next job imports it again, says so, and runs it
    fake_runtimes.configure(digests={"docker://busybox": "sha256:" + "1" * 64})
    moved = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                        "--container-image=docker://busybox", "--", "true", rank_dir=tmp_path / "9/n1/step-0/rank-0",
                        SLURM_JOB_ID="9", SLURM_STEP_ID="0")
    assert moved.returncode == 0, moved.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][8:] == ["digest", "import", "create", "start"]
    assert ("tether: docker://busybox has changed in its registry since your store's copy: importing it again "
            "(enroot) ...") in moved.stderr
    again = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                        "--container-image=docker://busybox", "--", "true", rank_dir=tmp_path / "9/n1/step-1/rank-0",
                        SLURM_JOB_ID="9", SLURM_STEP_ID="1")
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")][12:] == ["create", "start"]    # the job's next step
    # the registry unreachable: the store's copy runs, said so
    fake_runtimes.configure(import_fails=True)
    down = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true", rank_dir=tmp_path / "10/n1/step-0/rank-0",
                       SLURM_JOB_ID="10", SLURM_STEP_ID="0")
    assert down.returncode == 0 and again.returncode == 0, down.stderr
    assert ("tether: could not check docker://busybox against its registry ([ERROR] URL "
            "https://registry-1.docker.io/v2/library/busybox/manifests/latest returned error code: 404 Not Found); "
            "running the copy in your store on this node") in down.stderr


def test_the_fake_enroot_digest_replays_what_enroot_4_1_2_did(tmp_path, fake_runtimes):
    """The strict fake's `enroot digest` against the recorded cases (tests/fixtures/conformance,
    digest-*): the same words, streams and exit codes, byte for byte, under the setting the
    recording had (ENROOT_ALLOW_HTTP=yes: the 404's URL is http://, src/docker.sh's curl_proto)."""
    cases = {c["id"]: c for c in json.loads(
        (Path(__file__).parents[2] / "fixtures/conformance/enroot.json").read_text())["cases"]}
    env = {"PATH": fake_runtimes.path_env(), "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path),
           "ENROOT_ALLOW_HTTP": "yes"}
    for key in ("digest-usage", "digest-not-docker", "digest-docker", "digest-missing-tag"):
        case = cases[key]
        fake_runtimes.configure(digests={case["argv"][-1]: case["stdout"].strip()} if key == "digest-docker" else {},
                                import_fails=key == "digest-missing-tag")
        ran = subprocess.run(case["argv"], capture_output=True, text=True, env=env, timeout=60)
        assert (ran.returncode, ran.stdout) == (case["exit_code"], case["stdout"]), key
        assert ran.stderr == case["stderr"], key


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


# ---- the subprocess boundary, with pytest-subprocess (unregistered commands fail the test) ------
def test_enroot_preparation_runs_exactly_import_then_create(fp_quick, tmp_path):
    fp = fp_quick
    from tether.container.launch import run_before as run_all

    def run_before(launch):            # all but the start turn (its own test below): one process here
        if launch.before and launch.before[-1][1] is None:
            launch.before = launch.before[:-1]
        run_all(launch)

    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    s = spec(image="docker://ghcr.io/org/app:2", runtime="enroot", rank_dir=str(rank_dir))
    launch = adapter("enroot", {"binary": "/opt/enroot/bin/enroot"}).launch(s, HOST)
    sqsh = f"{tmp_path}/enroot-store-{os.getuid()}/{image_key(enroot_uri(s.image))[:24]}.sqsh"  # one file per image
    partial = f"{sqsh[:-5]}.{os.getpid()}.partial"
    fp.register(["/opt/enroot/bin/enroot", "digest", "docker://ghcr.io#org/app:2"], stdout="sha256:" + "a" * 64 + "\n")
    fp.register(["/opt/enroot/bin/enroot", "import", "--output", partial, "docker://ghcr.io#org/app:2"],
                callback=lambda process: Path(partial).write_text("sqsh"))
    data = tmp_path / "42/n2/step-0/enroot/data"

    def create(name):                  # what enroot create makes: the root at ENROOT_DATA_PATH/NAME
        return lambda process: (data / name).mkdir(parents=True)

    fp.register(["/opt/enroot/bin/enroot", "create", "--name", f"tether-42.0.partial-{os.getpid()}", sqsh],
                callback=create(f"tether-42.0.partial-{os.getpid()}"))
    run_before(launch)
    assert fp.call_count(["/opt/enroot/bin/enroot", "import", fp.any()]) == 1
    assert fp.call_count(["/opt/enroot/bin/enroot", "create", fp.any()]) == 1
    assert sorted(p.name for p in data.iterdir()) == ["tether-42.0"]          # renamed into place, whole
    for rank in (0, 1, 2):             # the step's other ranks on the node: the same root, no create
        run_before(adapter("enroot", {"binary": "/opt/enroot/bin/enroot"}).launch(
            spec(image="docker://ghcr.io/org/app:2", runtime="enroot", rank_dir=str(tmp_path / f"42/n2/step-0/rank-{rank}"),
                 rank=str(rank)), HOST))
    assert fp.call_count(["/opt/enroot/bin/enroot", "create", fp.any()]) == 1
    # a create that fails (killed, disk full) leaves nothing the next rank takes for the container
    data = tmp_path / "42/n2/step-1/enroot/data"
    fp.register(["/opt/enroot/bin/enroot", "create", "--name", f"tether-42.1.partial-{os.getpid()}", sqsh],
                callback=create(f"tether-42.1.partial-{os.getpid()}"), returncode=1,
                stderr="[ERROR] No space left on device\n")
    fp.register(["/opt/enroot/bin/enroot", "remove", "--force", f"tether-42.1.partial-{os.getpid()}"],
                callback=lambda process: (data / f"tether-42.1.partial-{os.getpid()}").rmdir())
    failing = adapter("enroot", {"binary": "/opt/enroot/bin/enroot"}).launch(
        spec(image="docker://ghcr.io/org/app:2", runtime="enroot", rank_dir=str(tmp_path / "42/n2/step-1/rank-3"),
             step_id="1"), HOST)
    with pytest.raises(LaunchError, match=r"(?s)failed to unpack the container root of docker://ghcr.io/org/app:2 "
                                          r"\(enroot create\): .*No space left on device"):
        run_before(failing)
    assert list(data.iterdir()) == []
    with pytest.raises(LaunchError, match="failed for another rank of this step on this node"):
        run_before(failing)                             # the step's next rank here: not tried again
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


def test_enroot_import_failure_is_reported_with_its_message(fp_quick, tmp_path):
    fp = fp_quick
    from tether.container.launch import run_before

    s = spec(image="docker://nope", runtime="enroot", rank_dir=str(tmp_path / "1/n1/step-0/rank-0"))
    launch = adapter("enroot", {}).launch(s, HOST)
    unauthorized = "[ERROR] URL https://registry-1.docker.io returned error code: 401 Unauthorized"
    fp.register(["enroot", "digest", fp.any()], returncode=1, stderr=unauthorized)    # not the failure told
    fp.register(["enroot", "import", fp.any()], returncode=1, stderr=unauthorized)
    with pytest.raises(LaunchError, match="(?s)failed to import docker image: docker://nope: .*401 Unauthorized"):
        run_before(launch)


def test_enroot_values_its_environment_file_would_change_arrive_exactly_as_pyxis_delivers_them(
        tmp_path, fake_runtimes, runtime_config):
    """enroot's environment file is one NAME=VALUE per line, and common::envfmt strips quotes around
    a whole value (twice): such values go into files of the rank's work directory that the command's
    own shell reads inside the container (pyxis 0.24 delivers them exactly); everything else arrives
    through the file exactly (checked through the fake, which sources the --conf script with bash
    and applies envfmt)."""
    from tether.container.runtimes.enroot import carried

    assert [carried(v) for v in ("plain", "it's", "a\"b'", "'x'", '"x"  ', "x\ny", "x\r", "")] == [
        True, True, True, False, False, False, False, True]
    values = {"Q1": "'quoted'", "NL": "a\nb\n\n", "OK1": "$(id) `id` ${HOME} \\ '", "NL2": "EOF\nTETHER",
              "OK3": "TETHER_END_OF_ENVIRONMENT", "OK4": "=a=b=", "OK5": ""}
    fake_runtimes.configure(exit_code=0)
    rank_dir = tmp_path / "7/n1/step-2/rank-1"
    proc = _tether_run(tmp_path, fake_runtimes, runtime_config, "--container-runtime=enroot",
                       "--container-image=docker://busybox", "--", "true", rank_dir=rank_dir, **values)
    assert proc.returncode == 0, proc.stderr
    assert "not passed" not in proc.stderr
    (started,) = fake_runtimes.calls("enroot-container")
    inside = started["container_env"]
    for name in ("OK1", "OK3", "OK4", "OK5"):
        assert inside[name] == values[name], name
    assert not {"Q1", "NL", "NL2"} & set(inside)             # not through enroot's file ...
    files = rank_dir / "work" / VALUES_DIR
    assert {f.name: f.read_text() for f in files.iterdir()} == {n: values[n] for n in ("Q1", "NL", "NL2")}
    assert {oct(f.stat().st_mode & 0o777) for f in files.iterdir()} == {"0o600"}
    # ... but read by the command's shell inside (the prologue itself, run here by sh)
    script = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    shown = subprocess.run(["sh", "-c", VALUES_PROLOGUE, "sh", str(files), "/", sys.executable, "-c", script,
                            "Q1", "NL", "NL2"], capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout) == {n: values[n] for n in ("Q1", "NL", "NL2")}, shown.stderr
    assert not files.exists()                                    # read once, gone
    covered = subprocess.run(["sh", "-c", VALUES_PROLOGUE, "sh", str(files), "/", "true"], capture_output=True,
                             text=True, timeout=60)
    assert covered.returncode == 0 and "(a mount covers it): variables with a line break" in covered.stderr


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
    monkeypatch.setattr("tether.system.proc.run_quick",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "4.2.0\n", ""))
    argv = newer.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir, writable=True,
                             unshare=("net", "ipc", "uts")), HOST).argv
    assert argv[:6] == ["enroot", "start", "--rw", "--net", "--ipc", "--uts"]
    assert not [a for a in newer.launch(spec(image=str(sqsh), runtime="enroot", rank_dir=rank_dir), HOST).argv
                if a in ("--net", "--ipc", "--uts")]


def test_pmi_fd_reaches_an_enroot_rank_though_enroot_start_closes_every_descriptor(tmp_path, monkeypatch, capfd):
    """srun --mpi=pmi2 gives each task its PMI-2 connection as a descriptor (PMI_FD); real enroot
    4.1.2 closes every descriptor above 2 before the command (enroot-switchroot's closefrom: pyxis's
    mpi.bats "PMI2 file descriptor" failed on tether-enroot). The launcher serves it over a socket
    in the rank's work directory to tether-fd-receive (static, mounted from next to tether-run),
    which puts it back at PMI_FD's number. Run here with the container's mounts as host paths and
    every other descriptor closed, as enroot leaves the command."""
    import socket

    from tether.container.launch import run_before
    from tether.container.rank_launcher import build_fd_helper
    from tether.container.runtimes import enroot as enroot_runtime

    helper = build_fd_helper(tmp_path / "libexec" / "tether-fd-receive")
    monkeypatch.setattr(enroot_runtime, "fd_helper", lambda: str(helper))
    ours, slurmstepd = socket.socketpair()
    fd = os.dup(ours.fileno())                                   # the task's PMI_FD, above 2
    rank_dir = tmp_path / "7/n1/step-2/rank-0"
    for sub in ("work", "tmp"):
        (rank_dir / sub).mkdir(parents=True)
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 60)
    s = spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), job_id="7", step_id="2", rank="0",
             command=("sh", "-c", 'realpath /proc/self/fd/$PMI_FD; exec python3 -c "import os; '
                                  'os.write(int(os.environ[\'PMI_FD\']), b\'get_maxes\\n\')"'))
    launch = adapter("enroot", {}).launch(s, {**HOST, "PMI_FD": str(fd)})
    inside = "/run/tether/tether-fd-receive"                  # beside the work directory's mount
    start = launch.argv.index("tether-7.2")
    assert launch.argv[start + 1:start + 5] == [inside, f"{CONTAINER_WORKDIR}/.tether-pmi-fd", str(fd), "/bin/sh"]
    mounts = conf_printed(launch.argv[launch.argv.index("--conf") + 1], "mounts")
    assert f"{helper} {inside} none x-create=file,bind,ro,nosuid,nodev" in mounts     # after the rank's, read-only
    launch.before = [launch.before[-2]]            # the relay (the last step is the start turn; no enroot create)
    run_before(launch)
    # the work directory as short a path as the container's (a socket's path is at most 107 bytes;
    # pytest's, under xdist's worker directory, is longer)
    short = Path(tempfile.mkdtemp(prefix="tfd-"))
    (short / "w").symlink_to(rank_dir / "work")
    host = [a.replace(inside, str(helper)).replace(CONTAINER_WORKDIR, str(short / "w"))
            for a in launch.argv[start + 1:]]
    ran = subprocess.run(host, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "PMI_FD": str(fd)})
    assert ran.returncode == 0, ran.stderr
    assert "socket:[" in ran.stdout.splitlines()[-1]
    assert slurmstepd.recv(64) == b"get_maxes\n"                # the rank reached slurmstepd's end
    assert not (rank_dir / "work" / ".tether-pmi-fd").exists()   # the socket gone once served
    shutil.rmtree(short)
    # without the program beside the launcher: said (by each node's first rank), not silently lost
    monkeypatch.setattr(enroot_runtime, "fd_helper", lambda: None)
    capfd.readouterr()
    said = ("tether: PMI_FD (srun --mpi=pmi2) cannot reach the container: enroot start closes every descriptor "
            "above 2 and tether-fd-receive is not installed next to tether-run")
    for local_id, told in (("0", True), ("1", False)):
        bare = adapter("enroot", {}).launch(spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), rank="5"),
                                            {**HOST, "PMI_FD": str(fd), "SLURM_LOCALID": local_id})
        assert inside not in bare.argv and (said in capfd.readouterr().err) is told
    os.close(fd)


def test_ranks_sharing_a_root_start_it_in_turn_with_no_time_limit(tmp_path):
    """enroot start holds a root's own lock through its config, mounts and hooks but gives up after
    30 s ("Could not acquire rootfs lock"): with many ranks on a node sharing the step's root (or a
    named one) the last ones would fail. They take turns instead, each turn held until that rank's
    command has started, with no time limit."""
    from tether.container.runtimes.enroot import take_start_turn

    lock, started = tmp_path / "start.lock", tmp_path / "started-0"
    take_start_turn(str(lock), str(started))               # this rank's turn, until its command runs
    waiter = subprocess.Popen([sys.executable, "-c", "import sys; from tether.container.runtimes.enroot import "
                               "take_start_turn; take_start_turn(sys.argv[1], sys.argv[2]); print('turn')",
                               str(lock), str(tmp_path / "started-1")], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert waiter.poll() is None                           # the next rank waits (no 30 s limit to fail at)
    started.write_text("")                                 # this rank's command started: the turn passes
    out, _ = waiter.communicate(timeout=60)
    assert (waiter.returncode, out) == (0, "turn\n")
    (tmp_path / "x.sqsh").write_bytes(b"hsqs" + b"\0" * 60)
    plan = adapter("enroot", {}).launch(spec(image=str(tmp_path / "x.sqsh"), runtime="enroot",
                                             rank_dir=str(tmp_path / "5/n1/step-0/rank-2")), HOST)
    assert callable(plan.before[-1][0]) and plan.before[-1][1] is None       # the last step before the start


def test_a_fifo_or_link_where_a_rank_keeps_its_notes_fails_or_is_ignored_never_hangs(tmp_path):
    """The job's node directory is the user's: a FIFO planted where the once-per-job registry note
    goes, or where the ranks take their start turn, must not hang the rank (an open for writing
    waits for a reader), and a symlink there is never followed."""
    from tether.container.runtimes import pmi_fd

    for name in ("checked", "turn"):
        os.mkfifo(tmp_path / name)
    os.symlink("/etc/passwd", tmp_path / "link")
    script = ("import sys; from tether.container.runtimes import mark_checked; "
              "from tether.container.runtimes.enroot import take_start_turn; from tether.container.spec import LaunchError\n"
              "mark_checked(sys.argv[1] + '/checked'); take_start_turn(sys.argv[1] + '/turn', sys.argv[1] + '/started')\n"
              "try:\n    take_start_turn(sys.argv[1] + '/link', sys.argv[1] + '/started')\n"
              "except LaunchError as exc:\n    print(exc)\n")
    ran = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"cannot take the container's start lock {tmp_path}/link: ")
    assert Path("/etc/passwd").read_text().startswith("root:")
    # PMI_FD is the job's to set: only a small ASCII number naming an open descriptor counts
    assert [pmi_fd({"PMI_FD": v}) for v in ("\u0663", "9" * 40, "-1", "2", "", "1" + "0" * 5)] == [None] * 6


def test_enroot_with_the_entrypoint_sets_the_jobs_other_variables_after_it(tmp_path):
    """--container-entrypoint on enroot (pyxis): environ() prints only what the entrypoint starts
    with; the job's other variables are files the command's shell reads after the image's /etc/rc
    ran the entrypoint (LATER_PART, before the working directory's cd)."""
    from tether.container.runtimes import LATER_FILE, LATER_PART

    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs")
    launch = adapter("enroot", {"store": ""}).launch(
        spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), entrypoint=True, env_names=("OTHER",)), HOST)
    argv = launch.argv
    conf = argv[argv.index("--conf") + 1]
    assert "--rc" not in argv and conf_printed(conf, "rc") is None      # the image's /etc/rc: its entrypoint
    environ = conf_printed(conf, "environ")
    assert "OTHER=no" in environ and "RANK=3" in environ and "MYVAR" not in Path(conf).read_text()
    assert not (rank_dir / "work" / VALUES_DIR).exists()
    assert "export MYVAR='a,b\nc '\\''q'\\'' $(x)'\n" in (rank_dir / "work" / LATER_FILE).read_text()
    assert argv[-9:] == ["tether-42.0", "/bin/sh", "-c", STARTED_PROLOGUE + LATER_PART + CD_PROLOGUE, "sh",
                         f"{CONTAINER_WORKDIR}/{LATER_FILE}", CONTAINER_WORKDIR, "python", "train.py"]
    # with a value enroot's file cannot carry too: both parts, in their arguments' order, and their
    # loop variables do not take a job variable's name (f, v: VALUES_PART's before)
    both = adapter("enroot", {"store": ""}).launch(
        spec(image=str(sqsh), runtime="enroot", rank_dir=str(rank_dir), entrypoint=True,
             env_names=("MYVAR",)), {**HOST, "f": "job-f", "v": "job-v"})
    assert both.argv[-9:] == ["/bin/sh", "-c", STARTED_PROLOGUE + VALUES_PART + LATER_PART + CD_PROLOGUE, "sh",
                              f"{CONTAINER_WORKDIR}/{VALUES_DIR}", f"{CONTAINER_WORKDIR}/{LATER_FILE}",
                              CONTAINER_WORKDIR, "python", "train.py"]
    work = rank_dir / "work"
    show = "import json, os; print(json.dumps({n: os.environ.get(n) for n in ('MYVAR', 'f', 'v', '_tether_v')}))"
    ran = subprocess.run(["sh", "-c", VALUES_PART + LATER_PART + 'exec "$@"', "sh", str(work / VALUES_DIR),
                          str(work / LATER_FILE), sys.executable, "-c", show], capture_output=True, text=True,
                         timeout=60, env={"PATH": os.environ["PATH"]})
    assert json.loads(ran.stdout) == {"MYVAR": HOST["MYVAR"], "f": "job-f", "v": "job-v", "_tether_v": None}, ran


def test_a_cluster_store_image_is_started_as_it_is_with_the_images_env_under_the_jobs(tmp_path, monkeypatch):
    """Issue 44: a registry image the cluster image store holds is started from the store's
    squashfs itself (enroot start FILE: squashfuse under a discarded overlay): no import, no
    create, no removal, nothing in the user's store; the image's ENV (what enroot import keeps in
    /etc/environment) comes first in the environment script, so the job's values win over it.
    A named or saved container, the image's entrypoint and credentials in the reference keep the
    user's own import."""
    from tether.container.imagestore import Published
    from tether.container.runtimes import Runtime

    image = tmp_path / "store/images/ab.sqfs"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs" + bytes(92))
    asked = []

    def store_image(self, name):
        asked.append(name)
        return Published(name, "ab", "sha256:" + "e" * 64, str(image), 0.0,
                         {"env": ["PATH=/opt/conda/bin:/usr/bin:/bin", "MYVAR=from-image", "ONLY_IMAGE=1",
                                  "BAD=a\nb", "ENROOT_X=1",
                                  # a name that would end the script's here-document: shell run by enroot
                                  "A\nTETHER_END_OF_ENVIRONMENT\n}\necho INJECTED >&2\nf() {\ncat <<'X'\nB=1",
                                  "$(id)=1", "SP ACE=1"]})

    monkeypatch.setattr(Runtime, "cluster_store_image", store_image)
    rank_dir = tmp_path / "42/n2/step-0/rank-3"
    s = spec(image="nvcr.io#nvidia/pytorch:24.01-py3", runtime="enroot", rank_dir=str(rank_dir),
             env_names=("MYVAR",))
    launch = adapter("enroot", {"store": f"{tmp_path}/enroot-{{uid}}"}, cluster_store={"root": "x"}).launch(s, HOST)
    assert asked == ["nvcr.io/nvidia/pytorch:24.01-py3"]           # the store's spelling of the reference
    name_at = launch.argv.index(str(image))
    assert launch.argv[:2] == ["enroot", "start"] and launch.argv[name_at + 1:name_at + 3] == ["/bin/sh", "-c"]
    assert launch.before == [] and not any("remove" in step for step in launch.after)
    assert not (tmp_path / f"enroot-{os.getuid()}").exists() or not os.listdir(tmp_path / f"enroot-{os.getuid()}")
    conf = Path(launch.argv[launch.argv.index("--conf") + 1]).read_text()
    environ = conf_printed(launch.argv[launch.argv.index("--conf") + 1], "environ")
    assert "PATH=/opt/conda/bin:/usr/bin:/bin" in environ and "ONLY_IMAGE=1" in environ
    assert "MYVAR=a,b" not in conf and "MYVAR=from-image" not in conf     # the job's value (uncarried: a file)
    assert "BAD=" not in conf and "ENROOT_X" not in conf
    assert "INJECTED" not in conf and "$(id)" not in conf and "SP ACE" not in conf
    done = subprocess.run(["bash", "-c", 'source "$1"; environ', "bash", launch.argv[launch.argv.index("--conf") + 1]],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "" and "ONLY_IMAGE=1" in done.stdout
    from tether.container.runtimes.enroot import write_environ_conf
    with pytest.raises(LaunchError, match="not a variable name"):
        write_environ_conf(str(tmp_path / "bad.conf"), {"A\nB": "1"})
    assert launch.env["ENROOT_RUNTIME_PATH"] == f"{tmp_path}/42/n2/step-0/enroot/run"
    # what the store cannot give: the user's own import, as before (the store is not asked)
    for other in (dict(name="keep"), dict(save=str(tmp_path / "out.sqsh")), dict(entrypoint=True),
                  dict(image="alice@nvcr.io#nvidia/pytorch:24.01-py3")):
        asked.clear()
        kw = dict(image=s.image, runtime="enroot", rank_dir=str(rank_dir), env_names=("MYVAR",))
        launched = adapter("enroot", {"store": f"{tmp_path}/enroot-{{uid}}"},
                           cluster_store={"root": "x"}).launch(spec(**{**kw, **other}), HOST)
        assert asked == [] and str(image) not in launched.argv, other


def test_the_fuse_shim_of_an_image_started_as_a_file_is_hung_up_by_the_launcher(tmp_path, fake_runtimes):
    """enroot start FILE leaves a stopped "fuse shim" in a process group of its own, which ends the
    squashfuse mount on the SIGHUP of its orphaned group (enroot 4.1.2, runtime.sh). The launcher
    is a child subreaper of the same session, so the kernel never sends it: the launcher does (what
    the kernel does for an orphaned group), or the rank's end would wait out its whole grace."""
    sqfs = tmp_path / "img.sqfs"
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "environment").write_text("FROM_IMAGE=1\n")
    subprocess.run(["mksquashfs", str(tree), str(sqfs), "-quiet", "-noappend", "-no-progress"], check=True)
    fake_runtimes.configure(run=True)
    script = textwrap.dedent(f"""
        import json, os, subprocess, sys
        from tether.container import launch
        launch._set_subreaper(True)
        if sys.argv[1] == "off":
            launch._hang_up_orphans = lambda children, done=frozenset(): done
        done = subprocess.run([{str(fake_runtimes.bin_dir / 'enroot')!r}, "start", {str(sqfs)!r}, "true"],
                              env={{"PATH": {fake_runtimes.path_env()!r}, "HOME": {str(tmp_path)!r},
                                   "ENROOT_RUNTIME_PATH": {str(tmp_path / 'run')!r},
                                   "ENROOT_DATA_PATH": {str(tmp_path / 'data')!r},
                                   "ENROOT_CACHE_PATH": {str(tmp_path / 'cache')!r}}})
        reaped, left, ran_out = launch._reap_descendants(float(sys.argv[2]))
        print(json.dumps([done.returncode, reaped, left, ran_out, launch._children(os.getpid())]))
        """)
    outcomes = {}
    for mode, grace in (("on", 30), ("off", 1)):
        out = subprocess.run([sys.executable, "-c", script, mode, str(grace)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        outcomes[mode] = json.loads(out.stdout)
    assert outcomes["on"][0] == 0 and outcomes["on"][3] is False and outcomes["on"][4] == [], outcomes
    assert outcomes["on"][1] >= 1, outcomes                          # the shim, reaped
    assert outcomes["off"][3] is True and len(outcomes["off"][4]) == 1, outcomes   # stopped until killed
    try:
        os.kill(outcomes["off"][4][0], 9)
    except ProcessLookupError:
        pass                   # orphaned with its parent's end: the kernel hung it up
    (started,) = fake_runtimes.calls("enroot-container")[-1:]
    assert started["container_env"]["FROM_IMAGE"] == "1"            # the image's /etc/environment, read


def test_the_fake_enroot_starting_an_image_file_replays_what_enroot_4_1_2_did(public_dir):
    """The recorded start-sqsh-* cases (tests/fixtures/conformance/enroot.json): an unprivileged
    user, a squashfs file started as it is, /dev/fuse root's only (as on the recording machine:
    here a root-only file bound over it in a mount namespace of the test's own), the same words
    and exit code; and a runtime path under a directory that does not exist fails first."""
    from tether.testing.runtimes import FakeRuntimes

    tmp_path = public_dir
    fake_runtimes = FakeRuntimes(tmp_path / "fakes")
    cases = {c["id"]: c for c in json.loads(
        (Path(__file__).parents[2] / "fixtures/conformance/enroot.json").read_text())["cases"]}
    work, home, xdg = tmp_path / "en", tmp_path / "home", tmp_path / "xdg"
    for path in (work, home, xdg):
        path.mkdir(exist_ok=True)
        os.chown(path, 65534, 65534)
    (work / "tether+busybox+1.sqsh").write_bytes(b"hsqs" + bytes(92))
    fuse = tmp_path / "fuse"
    fuse.write_text("")
    fuse.chmod(0o600)
    for key in ("start-sqsh-with-xdg", "start-sqsh-xdg-missing-dir"):
        case = cases[key]
        env = {k: v.replace("<HOME>", str(home)).replace("<XDG_RUNTIME_DIR>", str(xdg))
               for k, v in case["env"].items()}
        env["PATH"] = fake_runtimes.path_env(env["PATH"])
        ran = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                              'mount --bind "$0" /dev/fuse && exec setpriv --reuid=65534 --regid=65534 '
                              '--clear-groups "$@"', str(fuse), "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                              *case["argv"]], capture_output=True, text=True, cwd=work, timeout=60)
        assert (ran.returncode, ran.stdout) == (case["exit_code"], case["stdout"]), (key, ran.stderr)
        assert ran.stderr == case["stderr"].replace("<TMP>", str(tmp_path)), key


START_IMAGE_CASES = ("sqfs-start-true", "sqfs-exit-status", "sqfs-not-squashfs", "sqfs-missing-path",
                     "sqfs-not-squashfs-bare-name", "sqfs-missing-bare-name", "sqfs-unreadable",
                     "sqfs-dir-not-searchable", "sqfs-rc-missing")


def test_the_fake_enroot_replays_real_enroots_start_of_an_image_file(public_dir):
    """What real enroot 4.1.2, built from its sources on this project's machine, did when a user
    started a squashfs file as it is (tests/fixtures/conformance/enroot-start-image.json, recorded
    by hand for the cluster image store): the same exit code and words for a good image, a file
    that is no squashfs, a missing one, a bare name, one the user cannot read, and a missing --rc.
    /dev/fuse is open to users here as udev makes it (a node of the test's own bound over it)."""
    from tether.testing.runtimes import FakeRuntimes

    fakes = FakeRuntimes(public_dir / "fakes")
    fakes.configure(run=True)
    recorded = json.loads((Path(__file__).parents[2] / "fixtures/conformance/enroot-start-image.json").read_text())
    cases = {c["id"]: c for c in recorded["cases"]}
    tmp, home, step = public_dir / "cases", public_dir / "home", public_dir / "step"
    for path in (tmp, home, step):
        path.mkdir()
        os.chown(path, 65534, 65534)
    tree = public_dir / "tree"
    (tree / "bin").mkdir(parents=True)
    img = public_dir / "store" / "img.sqfs"
    img.parent.mkdir(mode=0o711)
    subprocess.run(["mksquashfs", str(tree), str(img), "-quiet", "-noappend", "-no-progress"], check=True)
    img.chmod(0o444)
    (tmp / "x.sqfs").write_bytes(os.urandom(4096))
    shutil.copy(img, tmp / "unreadable.sqfs")
    (tmp / "unreadable.sqfs").chmod(0o400)
    (tmp / "closed").mkdir(mode=0o700)
    shutil.copy(img, tmp / "closed" / "img.sqfs")
    devices = public_dir / "dev"
    devices.mkdir()
    places = {"<IMG>": str(img), "<TMP>": str(tmp), "<HOME>": str(home), "<STEP>": str(step),
              "<PREFIX>/bin": str(fakes.bin_dir)}

    def fill(text: str) -> str:
        for key, value in places.items():
            text = text.replace(key, value)
        return text

    for key in START_IMAGE_CASES:
        case = cases[key]
        env = {k: fill(v) for k, v in case["env"].items()}
        argv = [fill(a) for a in case["argv"]]
        ran = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                              'mount -t tmpfs tmpfs "$0" && mknod -m 0666 "$0/fuse" c 10 229 && '
                              'mount --bind "$0/fuse" /dev/fuse && exec setpriv --reuid=65534 --regid=65534 '
                              '--clear-groups "$@"', str(devices), "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                              *argv], capture_output=True, text=True, cwd=fill(case.get("cwd", "<HOME>")), timeout=60)
        assert (ran.returncode, ran.stderr) == (case["exit_code"], fill(case["stderr"])), key
        assert ran.stdout == fill(case["stdout"]), key
    started = [c for c in fakes.calls("enroot-container")]
    assert [c["container"] for c in started] == [str(img)] * 2         # the good image, twice


# what the Python launcher's own start may not import on an enroot rank: subprocess (with signal,
# enum, locale, re: 43M instructions), typing (38M), hashlib (OpenSSL: 11M), threading (functools,
# collections: 8 ms) -- together they were 60% of an enroot rank's launcher (96M instructions of
# callgrind's count; 38M without, a bare interpreter 21M)
HEAVY_MODULES = ("subprocess", "typing", "hashlib", "_hashlib", "threading", "enum", "re", "json", "ctypes", "locale")


def test_an_enroot_ranks_launcher_runs_it_without_importing_what_costs_each_rank_milliseconds(tmp_path, fake_runtimes):
    """A squashfs rank through the installed launcher script (run.launcher_text, with -X
    importtime), create and start by the strict fake enroot: the rank runs, and none of
    HEAVY_MODULES was imported on the way."""
    from tether.container.run import launcher_text
    from tether.hooks.configfile import load_config

    settings = dict(load_config(None).data["container"])
    settings.update(runtime="enroot", enroot={"binary": str(fake_runtimes.bin_dir / "enroot"), "args": [], "env": {},
                                              "store": ""})
    launcher = tmp_path / "tether-run-py"
    text = launcher_text(None, settings)
    first, rest = text.split("\n", 1)
    assert first.endswith(" -IS")
    launcher.write_text(f"{first}Ximporttime\n{rest}")
    launcher.chmod(0o755)
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(4092))
    rank_dir = tmp_path / "7/n1/step-0/rank-0"
    rank_dir.mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TETHER_RUN_ARGV0": "", "TETHER_CONTAINER_IMAGE": str(sqsh),
           "TETHER_CONTAINER_RUNTIME": "enroot", "TETHER_RANK_DIR": str(rank_dir), "SLURM_JOB_ID": "7",
           "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "RANK": "0"}
    proc = subprocess.run([str(launcher), "true"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"][1] for c in fake_runtimes.calls("enroot")] == ["create", "start"]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "tether.container.runtimes.enroot" in imported and "tether.system.proc" in imported
    assert sorted(imported & set(HEAVY_MODULES)) == []


def test_an_enroot_outside_the_jobs_path_finds_its_own_helpers(tmp_path, fake_runtimes):
    """enroot execs enroot-nsenter by name (runtime.sh): an enroot installed under /opt, not on the
    job's PATH, failed every rank with exit 127 (seen by hand with enroot 4.1.2). Its directory
    goes first on enroot's own PATH -- never into the container's variables."""
    sqsh = tmp_path / "img.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(4092))
    host = {**HOST, "PATH": "/usr/bin:/bin"}
    s = spec(image=str(sqsh), runtime="enroot", rank_dir=str(tmp_path / "42/n2/step-0/rank-3"))
    binary = str(fake_runtimes.bin_dir / "enroot")
    launch = adapter("enroot", {"binary": binary, "store": ""}).launch(s, host)
    assert launch.env["PATH"] == f"{fake_runtimes.bin_dir}:/usr/bin:/bin"
    conf = Path(launch.argv[launch.argv.index("--conf") + 1]).read_text()
    assert "environ()" in conf and str(fake_runtimes.bin_dir) not in conf     # nothing of it in the container
    # later on PATH (an older enroot-nsenter earlier): moved first; a bare name (looked up on the
    # job's PATH as it is): left alone
    assert adapter("enroot", {"binary": binary, "store": ""}).base_env(
        {"PATH": f"/x:{fake_runtimes.bin_dir}"})["PATH"] == f"{fake_runtimes.bin_dir}:/x"
    assert adapter("enroot", {"store": ""}).base_env({"PATH": "/usr/bin"})["PATH"] == "/usr/bin"
    # a link to it elsewhere (/usr/local/bin/enroot -> /opt/enroot/bin/enroot): both directories
    (tmp_path / "links").mkdir()
    (tmp_path / "links/enroot").symlink_to(binary)
    assert adapter("enroot", {"binary": str(tmp_path / "links/enroot"), "store": ""}).base_env(
        {"PATH": "/usr/bin"})["PATH"] == f"{tmp_path / 'links'}:{fake_runtimes.bin_dir}:/usr/bin"
    # the strict fake replays the failure when it is not found
    (tmp_path / "data/c").mkdir(parents=True)
    failed = subprocess.run([binary, "start", "c", "true"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "ENROOT_DATA_PATH": str(tmp_path / "data"),
                                 "HOME": str(tmp_path)})
    assert (failed.returncode, failed.stderr) == (127, "/usr/lib/enroot/runtime.sh: line 354: exec: enroot-nsenter: "
                                                       "not found\n")


def test_a_quick_preparation_step_is_not_told_and_a_slow_one_is(monkeypatch):
    """A step with a quiet time (enroot create) says nothing when it ends first -- not even later:
    its thread is over when run_before returns -- and both lines once it has run that long (here
    made to outlast it by waiting for the first line). A rank waiting for another's quiet step
    says so only after that time too."""
    import fcntl

    from tether.container import launch as launching
    from tether.container.runtimes import Launch

    said: list[str] = []
    monkeypatch.setattr(launching, "progress", said.append)

    def quick(env):
        pass

    launching.run_before(Launch(argv=[], env={}, before=[(quick, None, "unpacking x", "failed x", 30.0)]))
    assert said == []

    def slow(env):                         # ends only once the start has been told (or 20 s)
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)

    launching.run_before(Launch(argv=[], env={}, before=[(slow, None, "unpacking y", "failed y", 0.05)]))
    assert said[0] == "unpacking y ..." and said[1].startswith("unpacking y: done in ") and len(said) == 2
    said.clear()
    launching.run_before(Launch(argv=[], env={}, before=[(quick, None, "importing z", "failed z")]))
    assert said[0] == "importing z ..." and said[1].startswith("importing z: done in ")   # no quiet time: told
    said.clear()

    def failing(env):
        raise LaunchError("no space")

    with pytest.raises(LaunchError):
        launching.run_before(Launch(argv=[], env={}, before=[(failing, None, "unpacking f", "failed f", 30.0)]))
    assert said == []                      # no late "..." line after a failure either
    # another rank holds the lock: its quiet step is waited for aloud only once the wait is long
    stop = launching.say_later("waiting: quiet", 30.0)
    assert stop() is False and said == []
    stop = launching.say_later("waiting: slow", 0.01)
    deadline = time.monotonic() + 20
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop() is True and said == ["waiting: slow"]


def test_the_launchers_threads_take_no_signal_of_the_main_threads(monkeypatch):
    """A thread the launcher starts (the quiet time, the start turn, the PMI descriptor) blocks
    every signal: a SIGCHLD delivered to it while the main thread waits with sigtimedwait would
    be lost (the rank's end then waits out its grace)."""
    import _thread

    from tether.container.launch import start_thread

    masks: list[str] = []
    done = _thread.allocate_lock()
    done.acquire()

    def record():
        with open(f"/proc/self/task/{_thread.get_native_id()}/status") as fh:
            masks.append(next(line.split()[1] for line in fh if line.startswith("SigBlk:")))
        done.release()

    start_thread(record)
    assert done.acquire(timeout=20)
    assert int(masks[0], 16) & (1 << (17 - 1)) and int(masks[0], 16) & (1 << (15 - 1))     # SIGCHLD, SIGTERM
    with open("/proc/self/status") as fh:                                                    # the caller's unchanged
        assert not int(next(line.split()[1] for line in fh if line.startswith("SigBlk:")), 16) & (1 << (17 - 1))


@pytest.mark.parametrize("made", [True, False])
@pytest.mark.parametrize("ahead", [False, True])
def test_a_wait_for_the_lock_is_told_as_the_step_itself_when_this_ranks_launcher_started_it(tmp_path, monkeypatch,
                                                                                           ahead, made):
    """The lock held (here by another process, as tether-run's child holds it for its create
    ahead): the wait is told after the step's quiet time -- as the rank's own step when its C
    launcher started it (TETHER_RUN_AHEAD), as another rank's otherwise -- and the step, done
    by then, does not run again."""
    import fcntl

    from tether.container import launch as launching
    from tether.container.runtimes import Launch

    said: list[str] = []
    monkeypatch.setattr(launching, "progress", said.append)
    lock, root = tmp_path / "enroot" / ".lock", tmp_path / "enroot" / "data" / "root"
    root.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.readline()
        if sys.argv[3] == "made":
            os.mkdir(sys.argv[2])
        """), str(lock), str(root), "made" if made else "failed"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        ran: list[str] = []

        def release_when_told():              # the holder ends once the wait has been told
            deadline = time.monotonic() + 20
            while not said and time.monotonic() < deadline:
                time.sleep(0.01)
            holder.stdin.write("\n")
            holder.stdin.flush()

        launching.start_thread(release_when_told)

        def create(env):                      # run here: long enough to be told (0.5 s at most)
            ran.append("create")
            told = len(said)
            deadline = time.monotonic() + 0.5
            while len(said) == told and time.monotonic() < deadline:
                time.sleep(0.01)

        launching.run_before(Launch(argv=[], env={}, lock=str(lock),
                                    before=[(create, str(root), "unpacking r", "failed r", 0.05)]), ahead=ahead)
    finally:
        holder.kill()
        holder.wait()
    # a step the holder left undone runs here, its start told once (a create ahead that failed)
    if ahead:
        assert said[0] == "unpacking r ..." and said[1].startswith("unpacking r: done in ") and len(said) == 2
    else:
        assert said[0] == "waiting for another rank on this node: unpacking r"
        assert said[1:] == [] if made else said.count("unpacking r ...") <= 1
    assert ran == ([] if made else ["create"])


def test_the_scripts_hold_the_environments_own_bytes_and_text_the_locale_cannot_encode_as_utf8(tmp_path, monkeypatch):
    """write_private writes what os.environ decoded as the bytes it came from (the C launcher
    writes those bytes as they are); text the locale's encoding cannot hold (a config's path, read
    as UTF-8, under a Latin-1 locale) is written as UTF-8 instead of failing the rank."""
    from tether.container.runtimes import write_private

    value = os.fsdecode(b"caf\xe9 \xff")          # not UTF-8: as os.environ hands it over
    path = write_private(str(tmp_path / "s" / "env"), f"A={value}\n", "", "a script")
    assert Path(path).read_bytes() == b"A=caf\xe9 \xff\n" and oct(os.stat(path).st_mode & 0o777) == "0o600"

    def latin1(text):
        return text.encode("latin-1")            # what os.fsencode is under an ISO-8859-1 locale

    monkeypatch.setattr(os, "fsencode", latin1)
    path = write_private(str(tmp_path / "s" / "mounts"), "/scratch /\u6570\u636e none x-create=dir,bind\n", "", "x")
    assert Path(path).read_bytes() == "/scratch /\u6570\u636e none x-create=dir,bind\n".encode()
    path = write_private(str(tmp_path / "s" / "latin"), "/donn\xe9es\n", "", "x")
    assert Path(path).read_bytes() == b"/donn\xe9es\n"          # the locale's own bytes, as podman's argv

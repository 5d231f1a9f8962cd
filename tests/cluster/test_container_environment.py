"""Issue 22: the job's environment inside the container, on the real cluster, for every runtime.

Podman runs for real; Apptainer, Singularity and Enroot are the testing kit's strict fakes
(tether.testing.runtimes: they build the program's environment by the runtimes' own rules -- enroot's
``--conf`` script really sourced by bash, its envfmt, Apptainer's create.go -- and record it), named
as the runtimes' binaries in the sandbox's tether.yaml for the length of a test. Each step is a real
``srun`` as the job user, handed to tether's launcher by the SPANK plugin in slurmstepd.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tether.container.spec import CONTAINER_WORKDIR
from tether.job_submit.handler import CONFIG_CHECK_SECONDS
from tether.testing.runtimes import FakeRuntimes

pytestmark = pytest.mark.cluster

PRINT = "for v in FOO PATH LD_LIBRARY_PATH HF_HOME RANK TMPDIR; do eval \"echo $v=\\${$v-unset}\"; done"
HOST_PATH = "/opt/host-only/bin:/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def fakes(cluster) -> FakeRuntimes:
    """The fake runtimes where the job user can run them (under the sandbox's root)."""
    root = cluster.box.root / "fake-runtimes"
    (root / "state" / "calls.jsonl").unlink(missing_ok=True)    # an earlier session's
    fakes = FakeRuntimes(root, python=cluster.box.python)
    for path in (root, fakes.bin_dir):
        os.chmod(path, 0o755)
    (root / "img.sif").write_text("")                    # an image file apptainer can open
    os.chmod(root / "img.sif", 0o644)
    return fakes


@pytest.fixture
def settings(cluster, fakes):
    """Switch the sandbox's tether.yaml for one test (the launcher re-reads a changed config); restored."""
    path = cluster.box.tether_conf
    # kept by a second link: restoring it by content would leave a file of another identity, and
    # every container rank of the session would take the Python launcher (tether doctor warns)
    installed = path.with_suffix(".installed")
    installed.unlink(missing_ok=True)
    os.link(path, installed)

    def write(environment: str = "inherit") -> None:
        data = cluster.box.tether_settings()
        data["container"]["environment"] = environment
        for name in ("apptainer", "singularity", "enroot"):     # the sandbox's own settings kept (enroot's store)
            data["container"][name] = {**data["container"].get(name, {}), "binary": str(fakes.bin_dir / name)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data))
        os.replace(tmp, path)
        time.sleep(CONFIG_CHECK_SECONDS + 0.05)

    yield write
    os.replace(installed, path)     # the very file (inode, size, mtime) tether-run was built for


def srun(cluster, fakes, runtime: str, image: str, *options: str, env: dict[str, str] | None = None,
         command: str = PRINT):
    """One task on one node as the job user with ``env`` exported; (result, what the program saw).
    Podman's program prints; a fake's recorded environment is the answer for the others."""
    before = len(fakes.calls())
    variables = {"FOO": "bar", "PATH": HOST_PATH, "LD_LIBRARY_PATH": "/host/lib", **(env or {})}
    argv = ["runuser", "-u", cluster.user, "--", "env", *(f"{k}={v}" for k, v in variables.items()),
            "srun", "-N1", "-n1", f"--container-runtime={runtime}",
            f"--container-image={image if runtime == 'podman' else fake_image(fakes, runtime)}", *options,
            "sh", "-c", command]
    result = cluster.run(argv, check=False, timeout=180)
    if runtime == "podman":
        seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    else:
        tool = "enroot-container" if runtime == "enroot" else runtime
        calls = [c for c in fakes.calls()[before:] if c["tool"] == tool]
        assert len(calls) == 1, (result.stdout, result.stderr, fakes.calls()[before:])
        seen = calls[0]["container_env"]
    return result, seen


def fake_image(fakes, runtime: str) -> str:
    return "docker://busybox:1.36" if runtime == "enroot" else str(fakes.root / "img.sif")


RUNTIMES = ["podman", "apptainer", "singularity", "enroot"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_job_environment_reaches_the_container_but_path_is_the_images(cluster, image, fakes, settings,
                                                                          runtime):
    settings("inherit")
    result, seen = srun(cluster, fakes, runtime, image, env={"HF_HOME": "/scratch/hf"})
    assert result.returncode == 0, result.stderr
    assert (seen.get("FOO"), seen.get("HF_HOME"), seen.get("RANK"), seen.get("TMPDIR")) == (
        "bar", "/scratch/hf", "0", "/tmp"), (result.stdout, result.stderr, seen)
    assert "/opt/host-only" not in seen.get("PATH", ""), seen          # the image's (or runtime's) PATH
    assert seen.get("LD_LIBRARY_PATH", "unset") == "unset", seen       # never the host's loader settings


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_container_env_makes_path_the_hosts(cluster, image, fakes, settings, runtime):
    settings("inherit")
    result, seen = srun(cluster, fakes, runtime, image, "--container-env=PATH")
    assert result.returncode == 0, result.stderr
    assert seen.get("PATH") == HOST_PATH and seen.get("FOO") == "bar", (result.stdout, result.stderr, seen)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_jobs_lang_stays_out_unless_named_as_pyxis_keeps_it(cluster, image, fakes, settings, runtime):
    """pyxis's env.bats "$LANG special case": the job's LANG, LANGUAGE and LC_ALL do not enter the
    container (a host locale the image lacks made perl warn in every step); --container-env=LANG
    brings LANG in ("forcing $LANG passthrough"); the other LC_* categories enter."""
    settings("inherit")
    locale = {"LANG": "de_DE.UTF-8", "LANGUAGE": "de_DE:de", "LC_ALL": "de_DE.UTF-8", "LC_TIME": "C.UTF-8"}
    show = "for v in LANG LANGUAGE LC_ALL LC_TIME FOO; do eval \"echo $v=\\${$v-unset}\"; done"
    result, seen = srun(cluster, fakes, runtime, image, env=locale, command=show)
    assert result.returncode == 0, result.stderr
    assert "de_DE" not in " ".join(seen.get(v, "") for v in ("LANG", "LANGUAGE", "LC_ALL")), seen
    assert (seen.get("LC_TIME"), seen.get("FOO")) == ("C.UTF-8", "bar"), seen
    result, seen = srun(cluster, fakes, runtime, image, "--container-env=LANG", env=locale, command=show)
    assert result.returncode == 0, result.stderr
    # (SingularityCE 3.4.2 forces LANG=C: there the job's LANG arrives as the LC_* categories)
    job_lang = seen.get("LC_CTYPE") if runtime == "singularity" and seen.get("LANG") == "C" else seen.get("LANG")
    assert job_lang == "de_DE.UTF-8", seen
    assert "de_DE" not in seen.get("LC_ALL", "") + seen.get("LANGUAGE", ""), seen


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_allowlist_mode_keeps_the_strict_contract(cluster, image, fakes, settings, runtime):
    settings("allowlist")
    result, seen = srun(cluster, fakes, runtime, image, "--container-env=HF_HOME", env={"HF_HOME": "/scratch/hf"})
    assert result.returncode == 0, result.stderr
    assert seen.get("FOO", "unset") == "unset" and seen.get("HF_HOME") == "/scratch/hf", (result.stdout, seen)
    assert seen.get("RANK") == "0" and "/opt/host-only" not in seen.get("PATH", ""), seen


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_large_and_hostile_environment_still_works(cluster, image, fakes, settings, runtime):
    """10,000 variables (about 600 kB) and one 100 kB value; values with quotes, `$(...)`, commas,
    '=' and line breaks; nothing of them on any command line (only names are)."""
    settings("inherit")
    big = {f"TETHERBIG_{i:05d}": f"value-{i}-" + "x" * 40 for i in range(10_000)}
    hostile = {"HOSTILE_SUBST": "$(touch /tmp/pwned) `id` ${HOME}", "HOSTILE_COMMA": "a,b=c,d",
               "HOSTILE_QUOTE": "it's \"quoted\" here", "HOSTILE_LONG": "y" * 100_000,
               "HOSTILE_NEWLINE": "one\nLD_PRELOAD=/evil.so"}
    command = ("echo COUNT=$(env | grep -c ^TETHERBIG_); echo LAST=$TETHERBIG_09999; echo LONG=${#HOSTILE_LONG}; "
               "echo SUBST=$HOSTILE_SUBST; echo COMMA=$HOSTILE_COMMA; echo QUOTE=$HOSTILE_QUOTE; "
               "echo LD=${LD_PRELOAD-unset}${LD_LIBRARY_PATH-unset}; echo NL_LINES=$(printf '%s' \"$HOSTILE_NEWLINE\" | wc -l)")
    result, seen = srun(cluster, fakes, runtime, image, env={**big, **hostile}, command=command)
    assert result.returncode == 0, result.stderr[-2000:]
    if runtime == "podman":
        assert (seen["COUNT"], seen["LAST"], seen["LONG"]) == ("10000", big["TETHERBIG_09999"], "100000"), seen
        assert (seen["SUBST"], seen["COMMA"], seen["QUOTE"]) == (
            hostile["HOSTILE_SUBST"], hostile["HOSTILE_COMMA"], hostile["HOSTILE_QUOTE"]), seen
        assert (seen["LD"], seen["NL_LINES"]) == ("unsetunset", "1"), seen       # one line break, kept
    else:
        assert sum(k.startswith("TETHERBIG_") for k in seen) == 10_000 and seen["TETHERBIG_09999"] == big[
            "TETHERBIG_09999"]
        for name in ("HOSTILE_SUBST", "HOSTILE_COMMA", "HOSTILE_QUOTE", "HOSTILE_LONG"):
            assert seen[name] == hostile[name], name
        assert "LD_PRELOAD" not in seen and "LD_LIBRARY_PATH" not in seen
        if runtime == "enroot":
            # its environment file cannot carry a line break: the value goes in a file of the rank's
            # work directory that the command's shell reads inside (VALUES_PROLOGUE; the fake records
            # enroot's own environment, and test_container_enroot runs the prologue)
            assert "HOSTILE_NEWLINE" not in seen and "not passed" not in result.stderr
            (start,) = [c for c in fakes.calls() if c["tool"] == "enroot" and c["argv"][1:2] == ["start"]][-1:]
            assert f"{CONTAINER_WORKDIR}/.tether-values" in start["argv"], start["argv"]
        else:
            assert seen["HOSTILE_NEWLINE"] == hostile["HOSTILE_NEWLINE"]
    assert not any(cluster.box.node_path(node, "/tmp/pwned").exists() for node in cluster.nodes)
    # no value on a command line: the runtime's argv holds names at most
    if runtime != "podman":
        tool = "enroot" if runtime == "enroot" else runtime
        for call in [c for c in fakes.calls() if c["tool"] == tool][-3:]:
            text = json.dumps(call["argv"])
            assert "value-9999-" not in text and "pwned" not in text and "yyyy" not in text


def test_enroot_without_namespace_support_refuses_container_unshare_with_the_reason(cluster, fakes, settings):
    """Issue 45: --container-unshare (pyxis 0.24) on enroot is start's --net/--ipc/--uts, which the
    recorded enroot 4.1.2 lacks (it also ignores the ENROOT_UNSHARE_* pyxis sets): the rank ends
    with the reason instead of running in the host's namespaces; PYXIS_CONTAINER_UNSHARE alike."""
    settings("inherit")
    base = ["runuser", "-u", cluster.user, "--", "env"]
    step = ["srun", "-N1", "-n1", "--container-runtime=enroot", f"--container-image={fake_image(fakes, 'enroot')}"]
    for asked in (["--container-unshare=net"], []):
        variables = [] if asked else ["PYXIS_CONTAINER_UNSHARE=net"]
        result = cluster.run([*base, *variables, *step, *asked, "true"], check=False, timeout=180)
        assert result.returncode != 0, (result.stdout, result.stderr)
        assert "--container-unshare=net: enroot 4.1.2 cannot give a container namespaces of its own" in result.stderr, \
            result.stderr


def test_the_ranks_of_an_enroot_step_on_a_node_share_one_container_root(cluster, fakes, settings):
    """Issue 45 (and 43): enroot create ran once per rank -- four ranks on a node unpacked the image
    four times, one after another -- where pyxis's tasks share one container per node. Under real
    Slurm, five ranks on two nodes racing for it: one create per node, every rank started in it."""
    settings("inherit")
    before = len(fakes.calls())
    result = cluster.run(["runuser", "-u", cluster.user, "--", "srun", "-N2", "-n5", "--container-runtime=enroot",
                          f"--container-image={fake_image(fakes, 'enroot')}", "true"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    calls = fakes.calls()[before:]
    creates = [c for c in calls if c["tool"] == "enroot" and c["argv"][1] == "create"]
    starts = [c for c in calls if c["tool"] == "enroot-container"]
    assert (len(creates), len(starts)) == (2, 5), calls
    assert len({c["container"] for c in starts}) == 1 and starts[0]["container"].startswith("tether-"), starts
    # a small image's create says nothing, as pyxis's does not -- unless this machine's load
    # made it take its quiet time (2 s): then one rank per node says it, with how long it took
    told = result.stderr.count("(enroot create) ...")
    assert told == result.stderr.count("(enroot create): done in ") <= 2, result.stderr


def _enroot_mounts(jobs: str) -> dict[int, list[str]]:
    """Mount points under the job storage root in each slurmd's and slurmstepd's mount namespace
    (a node's: slurmd's stays when the step's slurmstepd is gone), by pid."""
    found = {}
    for entry in os.scandir("/proc"):
        try:
            if not entry.name.isdigit() or open(f"/proc/{entry.name}/comm").read().strip() not in (
                    "slurmd", "slurmstepd"):
                continue
            lines = open(f"/proc/{entry.name}/mountinfo").read().splitlines()
        except OSError:
            continue
        found[int(entry.name)] = [line.split()[4] for line in lines if line.split()[4].startswith(jobs + "/")]
    return found


def test_a_container_steps_enroot_directory_is_a_mount_point_while_it_runs(cluster, fakes, settings):
    """Issue 43: enroot start walks up from the container's root to the nearest mount point, one
    `mountpoint` process per path component -- ~20 ms a start from a root 10 components deep. The
    SPANK plugin binds the step's enroot directory onto itself in slurmstepd, as root, while the
    step runs (its ranks see it), and unmounts it at the step's end: none is left."""
    settings()
    jobs = cluster.box.tether_settings()["job_storage_root"]

    def mounted() -> set[str]:
        return {m for mounts in _enroot_mounts(jobs).values() for m in mounts}

    name = f"bind-{os.getpid()}-{time.monotonic_ns()}"    # this step's job, among the session's long jobs
    cwd = str(cluster.box.work_dir)
    proc = subprocess.Popen(cluster.box.wrap(["runuser", "-u", cluster.user, "--", "srun", "-N1", "-n1", "-J", name,
                                              "--container-runtime=enroot",
                                              f"--container-image={fake_image(fakes, 'enroot')}", "sleep", "5"], cwd),
                            env=cluster.box.command_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    job, seen, deadline = "", set(), time.monotonic() + 60
    while not seen and proc.poll() is None and time.monotonic() < deadline:
        job = job or cluster.run(["squeue", "-h", "-n", name, "-o", "%i"], check=False).stdout.strip()
        seen = {m for m in mounted() if job and m.startswith(f"{jobs}/{job}/")}
        time.sleep(0.1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert len(seen) == 1 and re.fullmatch(re.escape(f"{jobs}/{job}/") + r"[^/]+/step-0/enroot", min(seen)), seen
    deadline = time.monotonic() + 30        # its slurmstepd ends a little after srun
    while seen & mounted() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not seen & mounted()
    assert not Path(min(seen)).exists()     # the step's directory went with it


def test_a_plain_enroot_rank_runs_in_the_c_launcher_under_slurm(cluster, fakes):
    """Issue 43: the common enroot rank -- a squashfs file, no container option but the image and
    the runtime -- runs in tether-run itself under real slurmstepd, with no Python launcher: five
    ranks on two nodes, one create per node, every rank started in the step's root with the job's
    variables, the command's exit code the step's. tether-run is built for the config it runs
    with (`tether slurm install`, as an admin after a change), and for the session's one again
    after."""
    path = cluster.box.tether_conf
    installed = path.with_suffix(".installed-c")
    installed.unlink(missing_ok=True)
    os.link(path, installed)
    image = fakes.root / "img.sqsh"
    image.write_bytes(b"hsqs" + bytes(4092))            # squashfs's magic: the fake's test of a file image
    os.chmod(image, 0o644)
    before = len(fakes.calls())
    try:
        data = cluster.box.tether_settings()
        data["container"]["enroot"] = {**data["container"].get("enroot", {}), "binary": str(fakes.bin_dir / "enroot")}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data))
        os.replace(tmp, path)
        cluster.box.install_plugins(log=lambda m: None)
        fakes.configure(exit_code=3)
        result = cluster.run(["runuser", "-u", cluster.user, "--", "env", "FOO=bar", "TETHER_RUN_WHY_PYTHON=1",
                              "srun", "-N2", "-n5", "--container-runtime=enroot", f"--container-image={image}",
                              "true"], check=False, timeout=300)
    finally:
        fakes.configure(exit_code=0)
        os.replace(installed, path)     # the very file the session's tether-run is built for ...
        cluster.box.install_plugins(log=lambda m: None)      # ... and that launcher again
    assert result.returncode == 3, result.stderr
    assert "tether-run: python" not in result.stderr and "no enroot run here" not in result.stderr, result.stderr
    calls = fakes.calls()[before:]
    creates = [c for c in calls if c["tool"] == "enroot" and c["argv"][1] == "create"]
    starts = [c for c in calls if c["tool"] == "enroot-container"]
    assert (len(creates), len(starts)) == (2, 5), calls
    assert {c["container_env"].get("FOO") for c in starts} == {"bar"}
    assert sorted(c["container_env"]["RANK"] for c in starts) == ["0", "1", "2", "3", "4"]
    assert {c["rc"] for c in starts} == {'    exec "$@"\n'}           # the command itself, not the image's rc

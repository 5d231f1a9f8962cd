"""tether.testing, the kit site staff test with: the fake Slurm and PBS commands (tether's real
job_submit handler and submit hook inside), strict fakes that refuse what the real programs
refuse, and the pytest plugin used from an empty directory as a site would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tether.hooks.configfile import load_config
from tether.hooks.plan import make_plan
from tether.testing.slurm import SubmissionRefused
from tether.hooks.request import Request
from tether.testing import FakePbs, FakeSlurm, SubmissionRefused

JOB = "#!/bin/sh\n#SBATCH --slots=8 --slots-per-node=4\necho job $SLURM_JOB_ID\n"


@pytest.fixture
def site(tmp_path):
    config = tmp_path / "tether.yaml"
    config.write_text("default_compute_resource_pool: gpu\njob_project_source: user\n")
    return config


def test_fake_sbatch_gives_tethers_plan_for_the_sites_config(tmp_path, site):
    slurm = FakeSlurm(tmp_path / "slurm", config=site)
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    job = slurm.job(slurm.sbatch(str(script), cwd=tmp_path))
    plan = make_plan(Request(slots=8, slots_per_node=4, origin="slurm", user="root"), load_config(str(site)), "slurm")
    assert (job["min_nodes"], job["max_nodes"]) == (plan.slurm.min_nodes, plan.slurm.max_nodes)
    assert job["partition"] == "gpu" == plan.partition and job["wckey"] == "root" and job["requeue"] == 0
    assert job["state"] == "PENDING" and job["tether"] == {"slots": "8", "slots-per-node": "4"}


def test_fake_sbatch_refuses_as_sbatch_and_the_plugin_do(tmp_path, site):
    slurm = FakeSlurm(tmp_path / "slurm", config=site)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    conflict = slurm.run("sbatch", "--slots=2", "--nodes=2", str(script))
    assert conflict.returncode == 1 and conflict.stderr.splitlines() == [
        "sbatch: error: tether: --nodes=2 conflicts with --nodes, which tether sets from the slot request; "
        "remove it (use --slots, --slots-per-node, --slot-type, --gpu-type or --resource-pool instead)",
        "sbatch: error: Batch job submission failed: Unspecified error"]
    bad = slurm.run("sbatch", "--slots=abc", str(script))
    assert bad.returncode == 255 and bad.stderr.splitlines()[-1] == "sbatch: error: Invalid --slots argument: abc"
    directive = tmp_path / "bad.sh"
    directive.write_text("#!/bin/sh\n#SBATCH --slotz=2\ntrue\n")
    typo = slurm.run("sbatch", str(directive))
    assert typo.returncode == 255 and "sbatch: unrecognized option '--slotz=2'" in typo.stderr
    with pytest.raises(SubmissionRefused):
        slurm.sbatch("--partition=nope", str(script))
    # a heterogeneous job is refused, never taken as its first component (that would hide what
    # job_submit answers each component, --gateways among them)
    het = tmp_path / "het.sh"
    het.write_text("#!/bin/sh\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH --gateways=1\ntrue\n")
    for argv in ([str(het)], ["-N1", ":", "-N1", str(script)]):
        refused = slurm.run("sbatch", *argv)
        assert refused.returncode == 1 and "heterogeneous jobs" in refused.stderr, (argv, refused.stderr)
    assert slurm.jobs() == {}                                  # nothing refused was kept


def test_a_fake_job_runs_its_steps_with_the_rank_contract(tmp_path, site):
    slurm = FakeSlurm(tmp_path / "slurm", config=site)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --slots=4 --slots-per-node=2 --slot-type=cpu\n"
                      "srun sh -c 'echo rank=$RANK/$WORLD_SIZE node=$SLURMD_NODENAME port=$MASTER_PORT'\n")
    job_id = slurm.sbatch(str(script), cwd=tmp_path)
    assert "(None)" in slurm.run("squeue", "-h", "-j", job_id, "-o", "%i %T %R").stdout
    final = slurm.run_job(job_id)
    assert final["state"] == "COMPLETED" and final["exit_code"] == "0:0"
    lines = sorted(Path(final["stdout"]).read_text().splitlines())
    port = 12288 + (int(job_id) % 1024) * 16
    # CPU slots: one task per node holding the node's slots as CPUs (the Slurm table's cpu row)
    assert lines == [f"rank={r}/2 node=n{r + 1} port={port}" for r in range(2)]
    assert final["cpus_per_task"] == 2 and final["nodes"] == ["n1", "n2"]
    assert slurm.run("squeue", "-h").stdout == ""
    assert slurm.run("sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode").stdout == f"{job_id}|COMPLETED|0:0\n"


def test_scontrol_update_and_scancel_go_through_tether(tmp_path, site):
    slurm = FakeSlurm(tmp_path / "slurm", config=site)
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    job_id = slurm.sbatch("--hold", str(script))
    refused = slurm.run("scontrol", "update", f"JobId={job_id}", "NumNodes=1")
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"Requested operation not supported on this system for job {job_id}"
    shown = slurm.run("scontrol", "show", "job", job_id).stdout
    assert f"JobId={job_id} " in shown and "JobState=PENDING Reason=JobHeldUser" in shown
    assert slurm.run("scancel", job_id).returncode == 0 and slurm.job(job_id)["state"] == "CANCELLED"


def test_fake_srun_hands_container_tasks_to_tethers_launcher(tmp_path, fake_runtimes):
    config = tmp_path / "tether.yaml"
    config.write_text(f"container: {{runtime: apptainer, apptainer_image_root: {tmp_path / 'images'}}}\n")
    image = tmp_path / "img.sif"
    image.write_text("")
    slurm = FakeSlurm(tmp_path / "slurm", config=config)
    env = slurm.env({"PATH": fake_runtimes.path_env(), "HOME": str(tmp_path)})
    result = slurm.run("srun", "-N2", "--ntasks-per-node=1", f"--container-image={image}", "python3", "-V", env=env)
    assert result.returncode == 0, result.stderr
    calls = fake_runtimes.calls("apptainer")
    assert sorted(c["container_env"]["RANK"] for c in calls) == ["0", "1"]
    assert all(c["command"] == ["python3", "-V"] and c["image"] == str(image) for c in calls)


def test_fake_qsub_runs_the_submit_hook_with_the_sites_config(tmp_path, site):
    pbs = FakePbs(tmp_path / "pbs", config=site, queues=["workq", "gpu"])
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#PBS -l tether_slots=8\n#PBS -l tether_slots_per_node=4\nhostname\n")
    job_id = pbs.qsub("-N", "train", str(script), cwd=tmp_path)
    job = pbs.job(job_id)
    assert job["Resource_List"]["select"] == "2:ngpus=4" and job["Resource_List"]["place"] == "scatter"
    assert job["queue"] == "gpu" and job["project"] == "root"
    shown = json.loads(pbs.run("qstat", "-f", "-F", "json", job_id).stdout)["Jobs"][job_id]
    assert shown["Resource_List"]["select"] == "2:ngpus=4" and shown["Rerunable"] == "False"
    rejected = pbs.run("qsub", "-l", "tether_slots=8,tether_slots_per_node=3", str(script))
    assert rejected.returncode == 32 and rejected.stderr.startswith("qsub: tether: tether_slots_per_node=3 does")
    unknown = pbs.run("qsub", "-l", "ngpus=2", str(script))       # a stock server has no ngpus
    assert unknown.returncode != 0 and "Unknown resource Resource_List.ngpus" in unknown.stderr
    assert pbs.run("qdel", job_id).returncode == 0
    assert pbs.run("qstat", job_id).returncode == 153 and pbs.run("qstat", "-x", job_id).returncode == 0
    assert pbs.run("qstat", "99.pbs").returncode == 153


# Every fake refuses an option the real program does not know, with the real program's message.
REFUSALS = [
    ("slurm", ["sbatch", "--bogus", "x.sh"], 255, "sbatch: unrecognized option '--bogus'"),
    ("slurm", ["srun", "--bogus", "true"], 255, "srun: unrecognized option '--bogus'"),
    ("slurm", ["srun", "-y", "true"], 255, "srun: invalid option -- 'y'"),
    ("slurm", ["squeue", "--bogus"], 255, "squeue: unrecognized option '--bogus'"),
    ("slurm", ["scontrol", "--bogus", "show", "job"], 1, "scontrol: unrecognized option '--bogus'"),
    ("slurm", ["scancel", "--bogus", "1"], 255, "scancel: unrecognized option '--bogus'"),
    ("slurm", ["sacct", "--bogus"], 255, "sacct: unrecognized option '--bogus'"),
    ("pbs", ["qsub", "-Z", "x.sh"], 2, "qsub: invalid option -- 'Z'"),
    ("pbs", ["qstat", "-Z"], 2, "qstat: invalid option -- 'Z'"),
    ("pbs", ["qdel", "-Z", "1"], 2, "qdel: invalid option -- 'Z'"),
    ("pbs", ["pbsnodes", "-Z"], 1, "pbsnodes: invalid option -- 'Z'"),
    ("pbs", ["pbs_tmrsh", "-Z", "n1", "true"], 255, "usage: pbs_tmrsh"),
    ("runtimes", ["apptainer", "exec", "--bogus", "img", "true"], 1, "unknown flag: --bogus"),
    ("runtimes", ["singularity", "exec", "--bogus", "img", "true"], 1, "unknown flag: --bogus"),
    ("runtimes", ["enroot", "create", "--bogus", "img"], 1, "Usage: enroot create"),
]


@pytest.mark.parametrize("kind,argv,status,message", REFUSALS, ids=[" ".join(r[1][:2]) for r in REFUSALS])
def test_every_fake_refuses_an_unknown_option(tmp_path, fake_runtimes, kind, argv, status, message):
    if kind == "slurm":
        bin_dir = FakeSlurm(tmp_path / "fake").bin_dir
    elif kind == "pbs":
        bin_dir = FakePbs(tmp_path / "fake").bin_dir
    else:
        bin_dir = fake_runtimes.bin_dir
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == status and message in result.stderr, (result.returncode, result.stderr)


SITE_TEST = '''\
def test_eight_gpu_slots_take_two_nodes(fake_slurm, tmp_path):
    (tmp_path / "job.sh").write_text("#!/bin/sh\\n#SBATCH --slots=8 --slots-per-node=4\\nhostname\\n")
    job = fake_slurm.job(fake_slurm.sbatch(str(tmp_path / "job.sh")))
    assert (job["min_nodes"], job["tres_per_node"]) == (2, "gres:gpu:4")
'''


def test_the_readme_example_runs_with_pytest_p_tether_testing_in_an_empty_directory(tmp_path):
    """What a site does: a directory with its tether.yaml and the README's five-line test."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "tether.yaml").write_text("tres_supported: false\n")   # GPUs as --gres per node
    (site_dir / "test_site.py").write_text(SITE_TEST)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert SITE_TEST.strip() in readme, "the README's example is the one tested here"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "TETHER_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"           # only what -p loads: the entry point by name
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "tether.testing", "-q", "-p", "no:cacheprovider",
                             "test_site.py"], cwd=site_dir, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr
    # and it can fail: with TRES (tether's default) the plan asks --gpus, and the same test fails
    (site_dir / "tether.yaml").write_text("tres_supported: true\n")
    failing = subprocess.run([sys.executable, "-m", "pytest", "-p", "tether.testing", "-q", "-p", "no:cacheprovider",
                              "test_site.py"], cwd=site_dir, env=env, capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1 and "1 failed" in failing.stdout, failing.stdout + failing.stderr


def test_tether_pbs_status_and_nodes_read_the_fake_servers_output(tmp_path, site):
    """`tether pbs status` / `nodes` (tether.pbs_hooks.commands) against the kit's qstat and pbsnodes."""
    pbs = FakePbs(tmp_path / "pbs", config=site, queues=["workq", "gpu"])
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nhostname\n")
    job_id = pbs.qsub("-l", "tether_slots=8,tether_slots_per_node=4", str(script))
    tether = [sys.executable, "-m", "tether.cli.main"]
    status = subprocess.run([*tether, "pbs", "status", job_id], env=pbs.env(), capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert status.stdout.split()[:5] == [job_id, "queued", "queue=gpu", "select=2:ngpus=4", "place=scatter"]
    missing = subprocess.run([*tether, "pbs", "status", "99.pbs"], env=pbs.env(), capture_output=True, text=True)
    assert missing.returncode == 1 and "Unknown Job Id 99.pbs" in missing.stderr
    nodes = subprocess.run([*tether, "pbs", "nodes"], env=pbs.env(), capture_output=True, text=True)
    assert nodes.returncode == 0 and nodes.stdout.splitlines()[0] == "n1 usable state=free ngpus=0 jobs=-"


def test_an_empty_container_image_means_no_container_at_submit(fake_slurm):
    """`--container-image=` runs a step on the host (issue 15); at sbatch it was refused with "no
    container image" while srun accepted it. Alone it is accepted; with other container options
    it is still an error."""
    fake_slurm.sbatch("--container-image=", "--wrap", "true")
    with pytest.raises(SubmissionRefused, match="--container-\\* options need --container-image"):
        fake_slurm.sbatch("--container-image=", "--container-mounts=/a:/b", "--wrap", "true")


def test_fake_enroot_runs_a_conf_script_as_strictly_as_enroot(tmp_path, fake_runtimes):
    """enroot.in runs with `set -euo pipefail`: a --conf script whose environ() uses an unset
    variable fails the start; one that is not a regular file or not valid bash is refused."""
    env = {**os.environ, "PATH": fake_runtimes.path_env(), "HOME": str(tmp_path),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "ENROOT_DATA_PATH": str(tmp_path / "data")}
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"hsqs")
    assert subprocess.run(["enroot", "create", "--name", "c", str(image)], env=env).returncode == 0
    unset = tmp_path / "unset.conf"
    unset.write_text("environ() {\n  echo X=$NO_SUCH_VARIABLE\n}\n")
    run = subprocess.run(["enroot", "start", "--conf", str(unset), "c", "true"], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "NO_SUCH_VARIABLE: unbound variable" in run.stderr
    bad = tmp_path / "bad.conf"
    bad.write_text("environ() {\n")
    run = subprocess.run(["enroot", "start", "--conf", str(bad), "c", "true"], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and f"Invalid argument: {bad}" in run.stderr
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    run = subprocess.run(["enroot", "start", "--conf", str(fifo), "c", "true"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 1 and f"No such file or directory: {fifo}" in run.stderr


def test_fake_srun_decides_a_container_step_as_the_spank_plugin_does():
    """testing.slurm.container_step follows spank/stepd.c: a non-empty image, or a name alone (the
    job's container of that name); an empty image: on the host; other container options typed
    without either: the step fails with the plugin's reason; variables alone: on the host."""
    from tether.testing.slurm import container_step

    assert container_step({"container-image": "/i"}, {}) == (True, None)
    assert container_step({}, {"TETHER_CONTAINER_IMAGE": "/i", "TETHER_CONTAINER_MOUNTS": "/a:/b"}) == (True, None)
    assert container_step({"container-image": ""}, {"TETHER_CONTAINER_MOUNTS": "/a:/b"}) == (False, None)
    assert container_step({"container-name": "dev"}, {}) == (True, None)
    assert container_step({}, {"TETHER_SLOTS": "2"}) == (False, None)
    assert container_step({"no-container-mount-home": "1"}, {}) == (
        False, "tether: --no-container-mount-home needs --container-image or --container-name: without either "
               "this step would run on the host without it")
    # a variable is a default (a job's, or a preference in a profile): no container, no error
    assert container_step({}, {"TETHER_CONTAINER_RUNTIME": "podman", "TETHER_CONTAINER_MOUNTS": "/a:/b"}) == (
        False, None)


COMPOSED_TEST = '''
def test_a_container_job_runs_on_the_fake_runtime(fake_slurm, fake_runtimes, tmp_path):
    image = tmp_path / "img.sif"
    image.write_text("")
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\\n#SBATCH -N2\\nsrun --ntasks-per-node=1 --container-image={image} true\\n")
    job_id = fake_slurm.sbatch(str(script))
    final = fake_slurm.run_job(job_id)
    assert final["state"] == "COMPLETED", final
    assert sorted(c["container_env"]["RANK"] for c in fake_runtimes.calls("apptainer")) == ["0", "1"]
    assert fake_slurm.job(job_id)["reservation"] is None          # never set: None, as Slurm's unset
'''


def test_the_kits_fixtures_compose_and_keep_to_their_own_directories(tmp_path):
    """Issue 41 (the testing kit): fake_runtimes are on the PATH of fake_slurm's jobs when a test
    uses both (before: the job failed, exit 125, and no call was recorded); the tether.yaml beside
    the test wins over a $TETHER_CONFIG in the environment; a field nobody set is None; a job's
    default output goes to the fake's own directory, not the test's working directory."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "tether.yaml").write_text(f"container: {{runtime: apptainer, apptainer_image_root: {tmp_path / 'img'}}}\n")
    (site_dir / "test_composed.py").write_text(COMPOSED_TEST)
    shell_config = tmp_path / "shell-tether.yaml"
    shell_config.write_text("container: {runtime: enroot}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "TETHER_"))}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", TETHER_CONFIG=str(shell_config))
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "tether.testing", "-q", "-p", "no:cacheprovider",
                             "test_composed.py"], cwd=site_dir, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr
    assert sorted(p.name for p in site_dir.iterdir() if p.name != "__pycache__") == ["test_composed.py", "tether.yaml"]

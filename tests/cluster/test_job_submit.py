"""The Slurm submit side on the real cluster: tether's SPANK options on sbatch/srun/salloc and the
job_submit plugin loaded by slurmctld, built and installed by `tether slurm build/install`.

Jobs are submitted as the unprivileged sandbox user; results are read from `scontrol show job`,
the jobs' own output and slurmctld's log.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from tether.job_submit.handler import CONFIG_CHECK_SECONDS

from helpers import env_prefix

pytestmark = pytest.mark.cluster

RANKS = "srun bash -c 'echo rank=$SLURM_PROCID node=$SLURMD_NODENAME gpus=${CUDA_VISIBLE_DEVICES:-none}'"


@pytest.fixture
def tether_config(cluster):
    """Write the sandbox's tether.yaml (the plugin re-reads it on change); restored afterwards."""
    path = cluster.box.tether_conf
    # kept by a second link: restoring it by content would leave a file of another identity, and
    # every container rank of the session would take the Python launcher (tether doctor warns)
    installed = path.with_suffix(".installed")
    installed.unlink(missing_ok=True)
    os.link(path, installed)

    def write(text: str | dict | None = None, **settings) -> None:
        if text is None:
            text = yaml.safe_dump({**cluster.box.tether_settings(), **settings})
        elif isinstance(text, dict):
            text = yaml.safe_dump(text)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        time.sleep(CONFIG_CHECK_SECONDS + 0.05)     # the plugin looks for changes this often

    write()
    yield write
    os.replace(installed, path)     # the very file (inode, size, mtime) tether-run was built for


def sbatch(cluster, *args: str, script: str | None = None, env: dict | None = None, wait: bool = True):
    """sbatch as the job user (``wait``: until the job has ended, as ``sbatch --wait`` but looking
    every 0.2 s); returns (CompletedProcess, job id or None, output text)."""
    work = cluster.box.work_dir
    out = work / "job-%j.out"
    argv = ["--parsable", f"--output={out}", *args]
    if script is not None:
        path = work / f"script-{os.getpid()}-{len(list(work.iterdir()))}.sh"
        path.write_text(script)
        argv.append(str(path))
    else:
        argv += ["--wrap", RANKS]
    if wait:
        result = cluster.sbatch_wait(argv, env=env, check=False)
    else:
        result = cluster.as_user([*env_prefix(env), "sbatch", *argv], check=False)
    job_id = result.stdout.strip().split(";")[0] or None
    output = (work / f"job-{job_id}.out").read_text() if job_id and (work / f"job-{job_id}.out").exists() else ""
    return result, job_id, output


def ranks(output: str) -> list[str]:
    return sorted(line for line in output.splitlines() if line.startswith("rank="))


# ---- the Slurm resource table, one row per case, config switched through tether.yaml --------------
ROWS = {
    "tres+gres with slots per node": (
        {}, ["--slots=6", "--slots-per-node=2"],
        {"NumNodes": "3", "NumTasks": "3", "TresPerJob": "gres:gpu:6", "TresPerTask": "gres:gpu:2"},
        ["gpus=0,1"] * 3),
    "tres+gres, Slurm places the GPUs": (
        {}, ["--slots=6"],
        {"NumNodes": "2", "NumTasks": "2", "TresPerJob": "gres:gpu:6"}, None),
    "gres only": (
        {"tres_supported": False}, ["--slots=8", "--slots-per-node=4"],
        {"NumNodes": "2", "NumTasks": "2", "TresPerNode": "gres:gpu:4"}, ["gpus=0,1,2,3"] * 2),
    "cpu slots": (
        {}, ["--slots=6", "--slots-per-node=2", "--slot-type=cpu"],
        {"NumNodes": "3", "NumTasks": "3", "CPUs/Task": "2"}, ["gpus=none"] * 3),
    "neither tres nor gres": (
        {"tres_supported": False, "gres_supported": False}, ["--slots=6", "--slots-per-node=2"],
        {"NumNodes": "3", "NumTasks": "3"}, ["gpus=none"] * 3),
    "tres without gres falls back": (
        {"gres_supported": False}, ["--slots=4", "--slots-per-node=2"],
        {"NumNodes": "2", "NumTasks": "2"}, ["gpus=none"] * 2),
    "zero slots in the aux pool": (
        {"default_aux_resource_pool": "aux"}, ["--slots=0"],
        {"NumNodes": "1", "NumTasks": "1", "Partition": "aux"}, ["gpus=none"]),
    "compute pool and WCKey": (
        {"default_compute_resource_pool": "gpu", "job_project_source": "user"}, ["--slots=2"],
        {"Partition": "gpu", "WCKey": "tether-demo", "TresPerJob": "gres:gpu:2"}, None),
}


@pytest.mark.parametrize("case", list(ROWS))
def test_slurm_table_rows_through_sbatch(cluster, tether_config, case):
    settings, args, expected, rank_gpus = ROWS[case]
    expected = {k: cluster.gres(v.removeprefix("gres:")) if v.startswith("gres:") else v for k, v in expected.items()}
    tether_config(**settings)
    result, job_id, output = sbatch(cluster, *args)
    assert result.returncode == 0, result.stderr
    fields = cluster.job_fields(job_id)
    shown = {k: fields.get(k, "<absent>").lstrip("*") for k in expected}
    assert shown == expected
    assert fields["Requeue"] == "0" and fields["JobState"] == "COMPLETED"
    assert len(ranks(output)) == int(fields["NumTasks"])
    if rank_gpus is not None:
        assert [r.split()[2] for r in ranks(output)] == rank_gpus
    for key in ("TresPerJob", "TresPerNode", "TresPerTask", "CPUs/Task"):
        if key not in expected and key != "CPUs/Task":
            assert key not in fields, f"{key}={fields.get(key)} was not expected"


def test_a_size_sweep_is_answered_by_its_shape_in_c(cluster, tether_config):
    """Requests that differ in their slot counts, image tag, --container-env names, plain bind
    mounts, --container-workdir, --container-name and absolute --container-save only are one shape: the handler answers the first, the shim's C
    the others (slurmctld's debug log says which), and each job gets its own layout."""
    tether_config()
    cluster.run(["scontrol", "setdebug", "debug"])
    mark = cluster.ctld_log_mark()
    jobs = {}
    try:
        for slots in (2, 4, 6, 8, 12):
            result, job_id, _ = sbatch(cluster, "-H", f"--slots={slots}", "--slots-per-node=2",
                                       f"--container-image=localhost/app:v{slots}", f"--container-env=SWEEP_{slots}",
                                       f"--container-mounts=/sweep/{slots}:/data:ro", f"--container-workdir=/w{slots}",
                                       f"--container-name=sweep{slots}", f"--container-save=/sweep/{slots}.sqsh",
                                       "--job-name=sweep", wait=False)
            assert result.returncode == 0, result.stderr
            jobs[slots] = job_id
        log = cluster.ctld_log_since(mark)
    finally:
        cluster.run(["scontrol", "setdebug", "info"])
        cluster.run(["scancel", *[j for j in jobs.values() if j]], check=False)
    for slots, job_id in jobs.items():
        fields = cluster.job_fields(job_id)
        assert (fields["NumNodes"], fields["NumTasks"], fields["TresPerJob"], fields["TresPerTask"]) == (
            str(slots // 2), str(slots // 2), cluster.gres(f"gpu:{slots}"), cluster.gres("gpu:2")), slots
    # the first by the handler, the repeats by the shape in C; once (Slurm 24.11, a loaded machine)
    # the fifth went to the handler again, cause not yet found (issue 43): at most one such
    handled, by_shape = log.count("job_submit/tether: handler took"), log.count("job_submit/tether: answer by its shape took")
    assert handled + by_shape == 5 and handled <= 2 and by_shape >= 3, log


def test_another_users_request_of_a_known_shape_is_answered_in_c_unless_its_wckey_is_theirs(cluster, tether_config):
    """A shape one user's request made answers other users' too (a cluster of many users: each
    user's first request was a Python call in slurmctld), with each one's own layout; where the
    WCKey is the user's name (job_project_source: user) each user's request is their own."""
    box = cluster.box
    others = [f"tether-sh{os.getpid() % 100000}{n}" for n in "ab"]
    for user in others:
        box.add_job_user(user)
    jobs: list[str] = []
    layouts: list[tuple] = []

    def submit(user: str, slots: int) -> str:
        argv = ["sbatch", "--parsable", "-H", f"--slots={slots}", "--slots-per-node=2",
                f"--container-image=localhost/app:u{slots}", "--job-name=users", "--wrap", "true"]
        result = cluster.run(["runuser", "-u", user, "--", *argv], cwd=str(box.work_dir), check=False)
        assert result.returncode == 0, result.stderr
        jobs.append(result.stdout.strip().split(";")[0])
        return jobs[-1]

    try:
        for settings, theirs in (({}, False), ({"job_project_source": "user"}, True)):
            tether_config(**settings)
            cluster.run(["scontrol", "setdebug", "debug"])
            mark = cluster.ctld_log_mark()
            try:
                submit(cluster.user, 2)
                job = submit(others[0], 4)
                submit(others[1], 6)
                log = cluster.ctld_log_since(mark)
            finally:
                cluster.run(["scontrol", "setdebug", "info"])
            fields = cluster.job_fields(job)
            layouts.append(tuple(fields.get(k) for k in ("NumNodes", "NumTasks", "TresPerJob", "TresPerTask")))
            assert layouts[-1][1:3] == ("2", cluster.gres("gpu:4")), fields
            handled = log.count("job_submit/tether: handler took")
            by_shape = log.count("job_submit/tether: answer by its shape took")
            if theirs:
                assert (handled, by_shape) == (3, 0) and fields.get("WCKey", "").lstrip("*") == others[0], (
                    fields, log)
            else:
                # the others' by the first user's shape (answered per user: 3 handler calls); as in the
                # size sweep, one more handler call is let pass (once seen on 24.11, cause unknown)
                assert handled + by_shape == 3 and handled <= 2 and by_shape >= 1, log
        # the other user's layout by the first user's shape is the one the handler gave them
        assert layouts[0] == layouts[1], layouts
    finally:
        cluster.run(["scancel", *[j for j in jobs if j.isdigit()]], check=False)
        for user in others:
            box.remove_job_user(user)


def test_a_new_shape_runs_on_slurmctlds_thread_unless_it_needs_what_may_block(cluster, tether_config):
    """The handler's call for a new shape runs on slurmctld's own RPC thread (no hand-over to the
    worker and back, ~50 us of its locks) once the config is read; what may block -- the config
    read, a user's name never looked up (job_project_source: user names the WCKey after them; NSS
    may hang) -- goes to the worker, which a time limit guards. slurmctld's debug log says where
    each call ran; every job gets its plan."""
    box = cluster.box
    other = f"tether-th{os.getpid() % 100000}"
    box.add_job_user(other)
    jobs: list[str] = []

    def submit(user: str, save: str) -> None:
        argv = ["sbatch", "--parsable", "-H", "--slots=2", "--slots-per-node=2", "--container-image=localhost/app:1",
                f"--container-save={save}.sqsh", "--job-name=thread", "--wrap", "true"]
        result = cluster.run(["runuser", "-u", user, "--", *argv], cwd=str(box.work_dir), check=False)
        assert result.returncode == 0, result.stderr
        jobs.append(result.stdout.strip().split(";")[0])

    try:
        tether_config(job_project_source="user")
        cluster.run(["scontrol", "setdebug", "debug"])
        mark = cluster.ctld_log_mark()
        try:
            submit(cluster.user, "first")       # the config changed: read on the worker
            submit(cluster.user, "second")      # a new shape (its own relative file), the user known
            submit(other, "third")              # a new shape of a user never seen: the worker
            log = cluster.ctld_log_since(mark)
        finally:
            cluster.run(["scontrol", "setdebug", "info"])
        where = re.findall(r"job_submit/tether: handler took \d+ us \((on this thread|hand-off)", log)
        assert where == ["hand-off", "on this thread", "hand-off"], log
        for job, user in zip(jobs, (cluster.user, cluster.user, other)):
            fields = cluster.job_fields(job)
            assert (fields["TresPerJob"], fields.get("WCKey", "").lstrip("*")) == (cluster.gres("gpu:2"), user), fields
    finally:
        cluster.run(["scancel", *[j for j in jobs if j.isdigit()]], check=False)
        box.remove_job_user(other)


def test_submissions_at_the_same_time_all_get_an_answer(cluster, tether_config):
    """From Slurm 23.02 slurmctld calls job_submit plugins under a read lock, so two submissions
    can be in the plugin at once (22.05 serializes them): each waits its turn for the handler, none
    is refused as "busy" (CI on 24.11 saw two users' sruns started together refused so). Twelve new
    shapes at once, each planned as its own."""
    import subprocess

    tether_config()
    shapes = [(per_node, kind, image) for per_node in (1, 2, 4) for kind in ("cuda", "cpu") for image in ("", "x")]
    box = cluster.box
    jobs = [subprocess.Popen(box.wrap(["runuser", "-u", cluster.user, "--", "sbatch", "--parsable", "-H",
                                       "--job-name=together", f"--slots={2 * per_node}", f"--slots-per-node={per_node}",
                                       f"--slot-type={kind}", *([f"--container-image=localhost/{image}:1"] if image else []),
                                       "--wrap", "true"], str(box.work_dir)),
                             env=box.command_env(), cwd=str(box.work_dir), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for per_node, kind, image in shapes]
    done = [job.communicate(timeout=120) for job in jobs]
    ids = [out.strip().split(";")[0] for out, _ in done]
    try:
        assert [(job.returncode, err) for job, (_, err) in zip(jobs, done) if job.returncode] == []
        for (per_node, kind, _), job_id in zip(shapes, ids):
            fields = cluster.job_fields(job_id)
            assert (fields["NumNodes"].split("-")[0], fields["NumTasks"]) == ("2", "2"), (per_node, kind)
            if kind == "cpu":
                assert fields.get("CPUs/Task", "1") == str(per_node) and "TresPerJob" not in fields, fields
            else:
                assert fields["TresPerJob"] == cluster.gres(f"gpu:{2 * per_node}"), fields
    finally:
        cluster.run(["scancel", *[j for j in ids if j.isdigit()]], check=False)


def test_a_job_planned_on_more_nodes_than_its_partition_has_is_told_at_submit(cluster, tether_config):
    """Issue 45: ``--slots=4 --slot-type=cpu`` on the 3-node partition plans 4 nodes and pends
    forever (Reason PartitionNodeLimit), as ``-N4`` would; tether planned it, so sbatch says so --
    for an answer by its shape in C too (the 2-slot request teaches the shape), never for a job
    that fits."""
    tether_config()
    note = re.compile(r"tether: note: tether planned 4 nodes for this job, and (partition debug|its partition) has 3 "
                      r"\(slurm.conf\): the job will pend \(Reason PartitionNodeLimit\) until the partition has 4; "
                      r"a larger --slots-per-node needs fewer nodes")
    jobs = []
    try:
        for slots, partition in ((2, ()), (4, ()), (3, ()), (4, ("-p", "debug"))):
            result, job_id, _ = sbatch(cluster, "-H", f"--slots={slots}", "--slot-type=cpu", *partition, wait=False)
            assert result.returncode == 0, result.stderr
            jobs.append(job_id)
            assert bool(note.search(result.stderr)) == (slots == 4), (slots, result.stderr)
    finally:
        cluster.run(["scancel", *[j for j in jobs if j]], check=False)


@pytest.mark.parametrize("how", ["options", "#SBATCH lines", "TETHER_* variables"])
def test_options_script_lines_and_environment_give_the_same_job(cluster, tether_config, how):
    body = RANKS + "\n"
    if how == "options":
        result, job_id, _ = sbatch(cluster, "--slots=4", "--slots-per-node=2", "--slot-type=cuda")
    elif how == "#SBATCH lines":
        script = ("#!/bin/bash\n#SBATCH --slots=4\n#SBATCH --slots-per-node=2\n#SBATCH --slot-type=cuda\n"
                  + body)
        result, job_id, _ = sbatch(cluster, script=script)
    else:
        env = {"TETHER_SLOTS": "4", "TETHER_SLOTS_PER_NODE": "2", "TETHER_SLOT_TYPE": "cuda"}
        result, job_id, _ = sbatch(cluster, script="#!/bin/bash\n" + body, env=env)
    assert result.returncode == 0, result.stderr
    fields = cluster.job_fields(job_id)
    assert (fields["NumNodes"], fields["NumTasks"], fields["TresPerJob"], fields["TresPerTask"]) == (
        "2", "2", cluster.gres("gpu:4"), cluster.gres("gpu:2"))


def test_command_line_wins_over_script_lines_and_environment(cluster, tether_config):
    script = "#!/bin/bash\n#SBATCH --slots=2\n" + RANKS + "\n"
    result, job_id, _ = sbatch(cluster, "--slots=3", script=script, env={"TETHER_SLOTS": "1"})
    assert result.returncode == 0, result.stderr
    assert cluster.job_fields(job_id)["TresPerJob"] == cluster.gres("gpu:3")


def test_srun_and_salloc_allocations_are_planned(cluster, tether_config):
    out = cluster.as_user(["srun", "--slots=4", "--slots-per-node=2", "--label", "bash", "-c",
                           "echo $SLURM_JOB_ID $CUDA_VISIBLE_DEVICES"]).stdout
    lines = sorted(out.splitlines())
    assert [line.split()[-1] for line in lines] == ["0,1", "0,1"]
    job_id = lines[0].split()[1]
    assert cluster.job_fields(job_id)["TresPerTask"] == cluster.gres("gpu:2")
    out = cluster.as_user(["salloc", "--slots=2", "--slot-type=cpu", "--slots-per-node=2",
                           "bash", "-c", "echo $SLURM_JOB_ID"]).stdout
    fields = cluster.job_fields(out.split()[-1])
    assert (fields["NumNodes"], fields["CPUs/Task"]) == ("1", "2")


# ---- a job that asks nothing of tether ---------------------------------------------------------
VOLATILE = {"JobId", "SubmitTime", "EligibleTime", "AccrueTime", "StartTime", "EndTime", "Deadline",
            "LastSchedEval", "Priority", "StdErr", "StdOut", "StdIn", "Command", "RunTime",
            "SuspendTime", "SecsPreSuspend", "PreemptEligibleTime", "PreemptTime", "Reason",
            "AllocNode:Sid"}


def test_jobs_without_tether_options_are_untouched(cluster, tether_config):
    args = ["-H", "-N2", "-n2", "-c2", "--gpus=2", "--gres=gpu:1", "--time=5", "--comment=plain job",
            "--partition=gpu", "--requeue"]
    with_plugin = sbatch(cluster, *args, wait=False)[1]
    cluster.box.set_job_submit_plugins(None)
    try:
        without_plugin = sbatch(cluster, *args, wait=False)[1]
    finally:
        cluster.box.set_job_submit_plugins("tether")
    a, b = cluster.job_fields(with_plugin), cluster.job_fields(without_plugin)
    cluster.run(["scancel", with_plugin, without_plugin])
    assert {k: v for k, v in a.items() if k not in VOLATILE} == {k: v for k, v in b.items() if k not in VOLATILE}


# ---- rejections: tether's message reaches the user --------------------------------------------
@pytest.mark.parametrize("args,env,message", [
    (["--slots=-1"], None, "tether: --slots=-1: expected a whole number from 0 to 10000000"),
    (["--slots=abc"], None, "tether: --slots=abc: expected a whole number"),
    (["--slots=4", "--slots-per-node=0"], None, "tether: --slots-per-node=0: expected a whole number from 1"),
    (["--slots=2", "--slot-type=gpu"], None, "tether: --slot-type=gpu: expected one of cuda, rocm, cpu"),
    (["--slots=2", "--gpu-type=a100;id"], None, "tether: --gpu-type: expected a name of letters"),
    ([], {"TETHER_SLOTS": "x"}, "tether: TETHER_SLOTS=x: expected a whole number"),
    (["--slots=8", "--slots-per-node=3"], None,
     "tether: --slots-per-node=3 does not divide --slots=8; choose one of 1, 2, 4, 8"),
    (["--slots=2", "--slots-per-node=4"], None, "tether: --slots-per-node=4 is larger than --slots=2"),
    (["--slots=8", "-N2"], None, "tether: --nodes=2 conflicts with --nodes, which tether sets from the slot request"),
    (["--slots=8", "--ntasks=4"], None, "tether: --ntasks=4 conflicts with --ntasks"),
    (["--slots=8", "--gpus=2"], None, "tether: --gpus=2 conflicts with --gpus"),
    (["--slots=8", "--gres=gpu:2"], None, "tether: --gres=gpu:2 (or --gpus-per-node) requests GPUs"),
    (["--slots=8", "--gpus-per-node=2"], None, "tether: --gres=gpu:2 (or --gpus-per-node) requests GPUs"),
    (["--slots=4", "--slot-type=cpu", "-c2"], None, "tether: --cpus-per-task=2 conflicts with --cpus-per-task"),
    (["--gpu-type=a100"], None, "tether: --gpu-type needs --slots"),
    (["--slots=2", "-p", "gpu", "--resource-pool=aux"], None,
     "tether: --partition=gpu conflicts with --resource-pool=aux"),
])
def test_rejections_show_tethers_message(cluster, tether_config, args, env, message):
    result, job_id, _ = sbatch(cluster, *args, env=env, wait=False)
    assert result.returncode != 0 and job_id is None, result.stdout
    assert message in result.stderr, result.stderr


def test_bad_container_options_are_refused_at_submit(cluster, tether_config):
    """The run side's checks, at sbatch time: a job never waits in the queue to fail at start."""
    result, job_id, _ = sbatch(cluster, "--slots=2", "--container-image=/i", "--container-mounts=data:/d",
                               wait=False)
    assert result.returncode != 0 and job_id is None
    assert "tether: --container-mounts: 'data:/d': the source must be an absolute path" in result.stderr
    result, job_id, _ = sbatch(cluster, "--container-writable", wait=False)
    assert job_id is None and "tether: --container-* options need --container-image" in result.stderr
    env = cluster.run(["runuser", "-u", cluster.user, "--", "env", "TETHER_CONTAINER_IMAGE=/i",
                       "TETHER_CONTAINER_NAME=dev", "TETHER_CONTAINER_RUNTIME=apptainer", "srun", "true"], check=False)
    assert env.returncode != 0
    assert "tether: --container-name: apptainer keeps no container between steps (enroot and podman do)" in env.stderr


def test_container_variables_alone_are_a_preference_not_a_request(cluster, tether_config):
    """A user who exports TETHER_CONTAINER_RUNTIME (or ..._MOUNTS, ..._WORKDIR) in their profile,
    with no image: every job of theirs was refused ("--container-* options need
    --container-image"), a plain `srun true` too (issue 45). Such variables are defaults for
    container steps; typed on the command line without an image, they are still refused."""
    prefs = ["TETHER_CONTAINER_RUNTIME=podman", "TETHER_CONTAINER_WORKDIR=/tmp", "TETHER_CONTAINER_MOUNTS=/etc:/mnt"]
    plain = cluster.run(["runuser", "-u", cluster.user, "--", "env", *prefs, "srun", "-N1", "true"], check=False)
    assert plain.returncode == 0, plain.stderr
    result, job_id, _ = sbatch(cluster, "--slots=1", "--slot-type=cpu", env=dict(p.split("=", 1) for p in prefs))
    assert result.returncode == 0 and job_id, result.stderr
    typed = cluster.run(["runuser", "-u", cluster.user, "--", "srun", "-N1", "--container-runtime=podman", "true"],
                        check=False)
    assert typed.returncode != 0 and "--container-* options need --container-image" in typed.stderr


def test_cpus_per_task_is_the_users_for_gpu_slots(cluster, tether_config):
    result, job_id, _ = sbatch(cluster, "--slots=2", "-c3")
    assert result.returncode == 0, result.stderr
    assert cluster.job_fields(job_id)["CPUs/Task"] == "3"


def test_cpu_slot_jobs_tell_their_ranks_their_cpus_per_task(cluster, tether_config):
    """Issue 45: tether plans a CPU-slot job's --cpus-per-task in slurmctld, where sbatch and srun
    never see it, so neither the batch script nor the ranks had SLURM_CPUS_PER_TASK (scripts'
    OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK broke). It is the plan's CPUs per task now, in a batch
    job's script and its steps, and in srun's own allocation; a GPU-slot job gets none, as in Slurm."""
    show = "echo cpus=${SLURM_CPUS_PER_TASK:-unset}"
    script = f"#!/bin/sh\necho batch; {show}\nsrun sh -c 'echo rank; {show}'\n"
    result, job_id, output = sbatch(cluster, "--slots=4", "--slots-per-node=2", "--slot-type=cpu", script=script)
    assert result.returncode == 0 and cluster.job_fields(job_id)["CPUs/Task"] == "2", result.stderr
    assert output.split()[:2] == ["batch", "cpus=2"], output
    assert sorted(output.split()[2:]) == ["cpus=2", "cpus=2", "rank", "rank"], output    # the srun step's
    own = cluster.as_user(["srun", "--slots=2", "--slot-type=cpu", "sh", "-c", show])       # 1 per node
    assert own.stdout.split() == ["cpus=1", "cpus=1"], own.stderr
    wide = cluster.as_user(["srun", "--slots=4", "--slots-per-node=2", "--slot-type=cpu", "sh", "-c", show])
    assert wide.stdout.split() == ["cpus=2", "cpus=2"], wide.stderr
    gpu = cluster.as_user(["srun", "--slots=1", "sh", "-c", show])
    assert gpu.stdout.split() == ["cpus=unset"], gpu.stderr


# ---- robustness: slurmctld survives, tether jobs are never silently accepted ---------------------
def ping(cluster) -> bool:
    return "is UP" in cluster.run(["scontrol", "ping"], check=False).stdout


def test_bad_config_keeps_the_last_good_one(cluster, tether_config):
    tether_config(tres_supported=False)
    assert sbatch(cluster, "--slots=4", "--slots-per-node=4")[0].returncode == 0
    tether_config("tres_supported: [broken\n")
    result, job_id, _ = sbatch(cluster, "--slots=4", "--slots-per-node=4")
    assert result.returncode == 0, result.stderr
    assert cluster.job_fields(job_id)["TresPerNode"] == cluster.gres("gpu:4")     # still tres_supported: false
    assert "configuration not loaded (keeping the last good one)" in cluster.box.log_dir.joinpath(
        "slurmctld.log").read_text()
    assert ping(cluster)


def test_broken_config_at_start_rejects_tether_jobs_only(cluster, tether_config):
    tether_config("slot_type: gpu\n")
    cluster.box.restart_slurmctld()
    try:
        result, _, _ = sbatch(cluster, "--slots=2", wait=False)
        assert result.returncode != 0
        assert "tether unavailable: bad configuration" in result.stderr
        assert "slot_type: 'gpu' is not one of cuda, rocm, cpu" in result.stderr
        plain, job_id, _ = sbatch(cluster, "-N1", wait=False)
        assert plain.returncode == 0 and job_id
        assert ping(cluster)
        tether_config()                                  # fixed: the next tether job loads it
        result, job_id, _ = sbatch(cluster, "--slots=2")
        assert result.returncode == 0, result.stderr
    finally:
        tether_config()
        cluster.box.restart_slurmctld()


def test_broken_config_with_reject_all_jobs(cluster, tether_config):
    tether_config("plugin: {on_failure: reject_all_jobs}\nslot_type: gpu\n")
    cluster.box.restart_slurmctld()
    try:
        plain, _, _ = sbatch(cluster, "-N1", wait=False)
        assert plain.returncode != 0 and "tether unavailable: bad configuration" in plain.stderr
        assert ping(cluster)
        tether_config(plugin={"on_failure": "reject_all_jobs"})
        assert sbatch(cluster, "-N1")[0].returncode == 0
    finally:
        tether_config()
        cluster.box.restart_slurmctld()


FAULTS = {
    "exception": ("\n_handler.Handler.submit = lambda self, *a: 1 // 0\n", "ZeroDivisionError"),
    # recursion through C (sorted's key), as deep as the recursion limit lets it: on slurmctld's RPC
    # thread (1 MiB of stack) Python's default limit let it overflow the stack (slurmctld died)
    "deep recursion": ("\ndef _deep(n=0):\n    return sorted([1, 2], key=lambda _x: _deep(n + 1))\n"
                       "_handler.Handler.submit = lambda self, *a: _deep()\n", "RecursionError"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_exception_in_the_handler_rejects_tether_jobs_and_slurmctld_survives(cluster, tether_config, tmp_path,
                                                                            fault):
    from tether.job_submit import build as job_submit_build
    from tether.system.files import install_file

    # built against the sandbox's Slurm and Python (in its root, on another release)
    code = ("import sys; from pathlib import Path; from tether.job_submit import build; "
            "from tether.system.toolchain import CBuild, find_toolchain; out = Path(sys.argv[1]); "
            "print(build.build(out, find_toolchain(), CBuild(out), extra_init=sys.argv[2]))")
    injected, logged = FAULTS[fault]
    built = cluster.run([cluster.box.python, "-c", code, str(tmp_path), injected], timeout=600)
    faulty = Path(built.stdout.strip().splitlines()[-1])
    target = cluster.box.loaded_plugin_dir() / job_submit_build.SO_NAME     # the package's, in a Slurm root
    good = tmp_path / "good" / job_submit_build.SO_NAME
    good.parent.mkdir()
    shutil.copy2(target, good)
    install_file(faulty, target)
    cluster.box.restart_slurmctld()
    try:
        result, _, _ = sbatch(cluster, "--slots=2", wait=False)
        assert result.returncode != 0
        assert "tether unavailable: internal error in the job_submit handler" in result.stderr
        assert logged in cluster.box.log_dir.joinpath("slurmctld.log").read_text()
        assert sbatch(cluster, "-N1")[0].returncode == 0
        assert ping(cluster)
    finally:
        install_file(good, target)
        cluster.box.restart_slurmctld()
    assert sbatch(cluster, "--slots=2")[0].returncode == 0


# ---- job_modify ------------------------------------------------------------------------------------
def test_scontrol_update_of_a_tether_job(cluster, tether_config):
    tether_config(partition_overrides={"aux": {"slot_type": "cpu"}})
    _, job_id, _ = sbatch(cluster, "-H", "--slots=4", "--slots-per-node=2", wait=False)
    log = cluster.box.log_dir / "slurmctld.log"
    update = cluster.run(["scontrol", "update", f"job={job_id}", "NumNodes=3"], check=False)
    assert update.returncode != 0
    assert f"update of tether job {job_id} by uid 0 refused: --nodes=3" in log.read_text()
    update = cluster.run(["scontrol", "update", f"job={job_id}", "Partition=aux"], check=False)
    assert update.returncode != 0
    assert "from slurm-gpu-tres-gres to slurm-cpu" in log.read_text()
    cluster.run(["scontrol", "update", f"job={job_id}", "Partition=gpu"])
    fields = cluster.job_fields(job_id)
    assert (fields["Partition"], fields["TresPerJob"], fields["NumTasks"]) == ("gpu", cluster.gres("gpu:4"), "2")
    cluster.run(["scontrol", "update", f"job={job_id}", "TimeLimit=7"])      # unrelated: allowed
    assert cluster.job_fields(job_id)["TimeLimit"] == "00:07:00"
    plain = sbatch(cluster, "-H", "-N1-3", wait=False)[1]
    cluster.run(["scontrol", "update", f"job={plain}", "NumNodes=2"])      # not a tether job
    assert cluster.job_fields(plain)["NumNodes"].startswith("2")
    cluster.run(["scancel", job_id, plain])
    assert ping(cluster)


# ---- the install path --------------------------------------------------------------------------
def test_install_prints_the_lines_and_write_applies_them(cluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=x\nPluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm:{tmp_path}/plugins\n"
                    f"JobSubmitPlugins=lua\nPlugStackConfig={tmp_path}/plugstack.conf\n")
    (tmp_path / "plugstack.conf").write_text("optional /old/spank_tether.so\nrequired other.so\n")
    storage = tmp_path / "jobs"
    config = tmp_path / "tether.yaml"
    images = tmp_path / "images"
    config.write_text(f"job_storage_root: {storage}\ncontainer: {{apptainer_image_root: {images}}}\n")
    tether = cluster.box.tether              # the sandbox's Slurm's (in its root, on another release)
    build = cluster.box.plugin_build_dir
    # built here: a sandbox that installed tether's package built none, and one kept from an earlier
    # state of the sources holds a build install now refuses (other sources than its tether's)
    cluster.run([*tether, "slurm", "build", "--out", str(build)], timeout=600)
    common = ["--build-dir", str(build), "--slurm-conf", str(conf), "--config", str(config)]
    dry = cluster.run([*tether, "slurm", "install", *common])
    line = (f"required {tmp_path}/plugins/spank_tether.so job_storage_root={storage} "
            f"launcher={tmp_path}/plugins/tether-run user_dirs=/run/tether:/var/lib/tether/users")
    assert "JobSubmitPlugins=lua,tether" in dry.stdout and line in dry.stdout
    assert "JobSubmitPlugins=lua\n" in conf.read_text()                 # not written without --write
    assert not storage.exists() and not (tmp_path / "plugins").exists()  # nothing installed either
    assert "nothing was changed" in dry.stdout
    so = tmp_path / "plugins" / "job_submit_tether.so"
    cluster.run([*tether, "slurm", "install", *common, "--write"])
    inode = so.stat().st_ino
    cluster.run([*tether, "slurm", "install", *common, "--write"])
    assert "JobSubmitPlugins=lua,tether\n" in conf.read_text()
    again = cluster.run([*tether, "slurm", "install", *common]).stdout       # what is there is said so
    assert f"{conf} already has:\n  JobSubmitPlugins=lua,tether\n" in again
    assert f"{tmp_path / 'plugstack.conf'} already has:\n  {line}\n" in again and "add to" not in again
    assert (tmp_path / "plugstack.conf").read_text() == f"{line}\nrequired other.so\n"
    assert so.stat().st_ino != inode and oct(so.stat().st_mode & 0o777) == "0o755"
    assert storage.is_dir() and oct(storage.stat().st_mode & 0o777) == "0o755"
    assert oct(images.stat().st_mode & 0o7777) == "0o755" and not (images / "users").exists()   # root-only
    launcher = tmp_path / "plugins" / "tether-run"                      # the C rank launcher, then the Python one
    assert oct(launcher.stat().st_mode & 0o777) == "0o755" and launcher.read_bytes()[:4] == b"\x7fELF"
    python_launcher = tmp_path / "plugins" / "tether-run-py"
    assert oct(python_launcher.stat().st_mode & 0o777) == "0o755"
    assert f"handoff({str(config)!r}" in python_launcher.read_text()
    assert str(python_launcher).encode() in launcher.read_bytes()
    os.chmod(storage, 0o777)                                           # unsafe: refused
    refused = cluster.run([*tether, "slurm", "install", *common, "--write"], check=False)
    assert refused.returncode == 1
    assert f"job_storage_root {storage} must be a root-owned directory" in refused.stderr

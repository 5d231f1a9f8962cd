"""The Slurm run side on the real cluster: per-rank directories, the rank environment and cleanup,
done by the SPANK plugin inside slurmstepd for steps that carry tether options.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import job_entries, parse, public_base, storage, user_processes, wait_until

pytestmark = pytest.mark.cluster

SHOW = ("echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK NODE_RANK=$NODE_RANK WORLD_SIZE=$WORLD_SIZE "
        "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
        "TMPDIR=$TMPDIR WORK=$TETHER_WORK_DIR JOB_DIR=$TETHER_JOB_DIR SLOTS=$TETHER_JOB_SLOTS "
        "SLOT_IDS=${TETHER_SLOT_IDS:-none} ROCR=${ROCR_VISIBLE_DEVICES:-none} "
        "TMP_STAT=$(stat -c %U:%a $TMPDIR) WORK_STAT=$(stat -c %U:%a $TETHER_WORK_DIR)")


def test_six_ranks_get_their_environment_and_private_directories(cluster):
    result = cluster.as_user(["salloc", "--slots=6", "--slots-per-node=2", "--slot-type=cpu",
                              "srun", "-N3", "-n6", "-c1", "--label", "bash", "-c", SHOW])
    ranks = parse(result.stdout)
    assert [r["RANK"] for r in ranks] == [str(i) for i in range(6)], result.stderr
    job_dir = ranks[0]["JOB_DIR"]
    job_id = Path(job_dir).name
    assert Path(job_dir).parent == storage(cluster)
    ports = {r["MASTER_PORT"] for r in ranks}
    assert len(ports) == 1 and 12288 <= int(ports.pop()) < 28672
    for r in ranks:
        rank, node = int(r["RANK"]), int(r["RANK"]) // 2
        assert (r["LOCAL_RANK"], r["NODE_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) == (
            str(rank % 2), str(node), "6", "2")
        assert r["MASTER_ADDR"] == cluster.box.node_address(cluster.nodes[0])   # its NodeAddr, not its name
        assert r["TMPDIR"] == f"{job_dir}/{cluster.nodes[node]}/step-0/rank-{rank}/tmp"
        assert r["WORK"] == f"{job_dir}/{cluster.nodes[node]}/step-0/rank-{rank}/work"
        # the rank's tmp is a container's /tmp too: sticky and open, as an image's (its rank
        # directory, the user's 0700, keeps everyone else out); its work directory the user's alone
        assert (r["TMP_STAT"], r["WORK_STAT"]) == (f"{cluster.user}:1777", f"{cluster.user}:700")
        assert (r["SLOTS"], r["SLOT_IDS"]) == ("6", "none")
    assert wait_until(lambda: job_id not in job_entries(cluster))


def test_gpu_ranks_see_their_slot_ids(cluster):
    out = cluster.as_user(["salloc", "--slots=4", "--slots-per-node=2", "--slot-type=rocm",
                           "srun", "--label", "bash", "-c", SHOW]).stdout
    ranks = parse(out)
    assert len(ranks) == 2
    assert {(r["SLOT_IDS"], r["ROCR"]) for r in ranks} == {("0,1", "0,1")}


def test_concurrent_steps_get_different_master_ports(cluster):
    script = ("#!/bin/bash\n"
              "srun -n1 -c1 bash -c 'echo A $MASTER_PORT' &\n"
              "srun -n1 -c1 bash -c 'echo B $MASTER_PORT' &\n"
              "wait\n")
    path = cluster.box.work_dir / f"ports-{os.getpid()}.sh"
    path.write_text(script)
    out_file = cluster.box.work_dir / f"ports-{os.getpid()}.out"
    cluster.sbatch_wait(["--slots=2", "--slots-per-node=2", "--slot-type=cpu", f"--output={out_file}", str(path)])
    ports = dict(line.split() for line in out_file.read_text().splitlines() if line[:2] in ("A ", "B "))
    assert set(ports) == {"A", "B"} and ports["A"] != ports["B"]


def test_steps_without_tether_options_get_nothing(cluster):
    out = cluster.as_user(["srun", "-N1", "bash", "-c",
                           "echo RANK=${RANK:-unset} TMPDIR=${TMPDIR:-unset} "
                           "JOB=${TETHER_JOB_DIR:-unset} ID=$SLURM_JOB_ID; "
                           f"ls {storage(cluster)}"]).stdout
    first = out.splitlines()[0]
    assert "RANK=unset TMPDIR=/tmp JOB=unset" in first      # /tmp: Slurm's own default TMPDIR
    job_id = first.split("ID=")[1]
    assert job_id not in out.splitlines()[1:]


def test_a_planted_symlink_is_refused_and_never_followed(cluster, tmp_path):
    target = Path(public_base()) / f"tether-target-{os.getpid()}"
    target.mkdir(mode=0o777)
    os.chmod(target, 0o777)
    (target / "keep").write_text("precious\n")
    second = cluster.nodes[1]
    script = ("#!/bin/bash\n"
              f"ln -s {target} $TETHER_JOB_DIR/{second}\n"
              f"srun -N1 -n1 -w {second} bash -c 'echo ran-on-n2'\n"
              f"ln -s {target}/keep $TETHER_JOB_DIR/stray\n")
    path = cluster.box.work_dir / f"plant-{os.getpid()}.sh"
    path.write_text(script)
    out_file = cluster.box.work_dir / f"plant-{os.getpid()}.out"
    job = cluster.sbatch_wait(["--parsable", "--slots=3", "--slot-type=cpu",
                               f"--output={out_file}", str(path)]).stdout.strip()
    out = out_file.read_text()
    assert "ran-on-n2" not in out
    assert (f"tether: {storage(cluster)}/{job}/{second} is a symlink where tether's directory belongs; "
            f"refusing to follow it") in out
    assert sorted(p.name for p in target.iterdir()) == ["keep"]
    assert (target / "keep").read_text() == "precious\n"
    assert wait_until(lambda: job not in job_entries(cluster))   # the batch step's end removed the links
    assert target.exists()
    for p in target.iterdir():
        p.unlink()
    target.rmdir()


def test_an_unsafe_job_storage_root_stops_the_step_with_a_message(cluster):
    os.chmod(storage(cluster), 0o777)
    try:
        result = cluster.as_user(["srun", "--slots=1", "--slot-type=cpu", "true"], check=False)
    finally:
        os.chmod(storage(cluster), 0o755)
    assert (f"tether: job_storage_root {storage(cluster)} must be owned by root and not writable "
            f"by group or others") in result.stderr


def test_a_failing_command_leaves_nothing(cluster):
    result = cluster.as_user(["srun", "--slots=2", "--slots-per-node=2", "--slot-type=cpu",
                              "bash", "-c", "echo $SLURM_JOB_ID; test -d $TMPDIR && exit 3"], check=False)
    assert result.returncode == 3
    job = result.stdout.split()[0]
    assert wait_until(lambda: job not in job_entries(cluster))


def test_a_steps_directory_goes_with_it_and_the_jobs_with_the_job(cluster):
    """Within an allocation, a step's end removes its own directory; the job's directory and each
    node's in it stay for the next step (made and removed by every step, they cost 4 metadata
    operations more per node and step); slurmd's job epilog removes them at the job's end."""
    wait_gone = 'for i in $(seq 100); do ls "$J"/*/ | grep -q step- || break; sleep 0.1; done'
    script = (f'J={storage(cluster)}/$SLURM_JOB_ID; srun sh -c "echo STEP=\\$TETHER_STEP_DIR"; {wait_gone}; '
              'echo LEFT $(cd "$J" && ls -d */ */*); srun sh -c "echo STEP=\\$TETHER_STEP_DIR"; '
              f'{wait_gone}; echo LEFT $(cd "$J" && ls -d */ */*); echo JOB=$SLURM_JOB_ID')
    out = cluster.as_user(["salloc", "--slots=2", "--slots-per-node=1", "--slot-type=cpu", "sh", "-c", script],
                          timeout=120).stdout
    job = out.split("JOB=")[1].split()[0]
    steps = sorted(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("STEP="))
    nodes = sorted({Path(step).parent.name for step in steps})
    assert len(nodes) == 2 and set(nodes) <= set(cluster.nodes), out
    assert steps == sorted(f"{storage(cluster)}/{job}/{n}/step-{s}" for s in (0, 1) for n in nodes), out
    assert [line for line in out.splitlines() if line.startswith("LEFT")] == \
        ["LEFT " + " ".join(f"{n}/" for n in nodes)] * 2, out          # no step-*, the node dirs kept
    assert wait_until(lambda: job not in job_entries(cluster), timeout=60)


def test_scancel_of_a_running_step_leaves_nothing(cluster):
    job = cluster.as_user(["sbatch", "--parsable", "--slots=2", "--slots-per-node=2",
                           "--slot-type=cpu", "--output=/dev/null", "--wrap",
                           "srun bash -c 'touch $TMPDIR/x; exec sleep 500'"]).stdout.strip()
    assert wait_until(lambda: job in job_entries(cluster) and
                      any(storage(cluster).joinpath(job).rglob("x")), timeout=30)
    assert user_processes(cluster, "sleep 500")
    cluster.run(["scancel", f"{job}.0"])                 # the step, not the job
    assert wait_until(lambda: not user_processes(cluster, "sleep 500"), timeout=30)
    assert wait_until(lambda: not any(storage(cluster).joinpath(job).glob("*/step-0")), timeout=30)
    assert wait_until(lambda: job not in job_entries(cluster), timeout=30)   # the batch step ended too


def test_a_job_that_hits_its_time_limit_leaves_nothing(cluster, time_limited_jobs):
    timed_out_job = time_limited_jobs["plain"]
    assert wait_until(lambda: cluster.job_fields(timed_out_job)["JobState"] == "TIMEOUT",
                      timeout=150, step=2)
    assert wait_until(lambda: timed_out_job not in job_entries(cluster), timeout=30)
    assert not user_processes(cluster, "sleep 600")


def test_a_heterogeneous_job_mixes_a_tether_component_with_a_plain_one_and_one_step_spans_both(cluster,
                                                                                               registry_image):
    """Issue 18: component 0 asks for slots, component 1 for -N1 (before: `--nodes=1 conflicts
    with --nodes` -- component 0's options leaked into component 1 through Slurm's job-wide option
    state). One step across both (srun --het-group=0,1) has one rank world: global RANK and
    WORLD_SIZE, each component's index and first rank, one MASTER_ADDR:MASTER_PORT."""
    out = cluster.box.work_dir / f"het-{os.getpid()}.out"
    script = "\n".join([
        "#!/bin/sh",
        f"#SBATCH --slots=2 --slot-type=cpu --slots-per-node=2 --output={out}",
        "#SBATCH hetjob",
        "#SBATCH -N1 -n1",
        # the plan's CPUs per task as Slurm gives -c2 here: for component 0 only (a plain
        # SLURM_CPUS_PER_TASK=2 made Slurm 24.11's srun ask component 1 for 2 CPUs: it waited for ever)
        "echo BATCH plain=${SLURM_CPUS_PER_TASK:-unset} group0=${SLURM_CPUS_PER_TASK_HET_GROUP_0:-unset}",
        "srun --het-group=0,1 sh -c 'echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE NODE_RANK=$NODE_RANK "
        "COMPONENT=$TETHER_HET_COMPONENT OFFSET=$TETHER_HET_OFFSET NNODES=$TETHER_NNODES "
        "MASTER=$MASTER_ADDR:$MASTER_PORT NODE=$SLURMD_NODENAME'",
        # each part of `srun A : B` its own options (Slurm 22.05 sends both the same: tether sorts them)
        "where='echo STEP2 RANK=$RANK COMPONENT=$TETHER_HET_COMPONENT "
        "IN=$(test -e /etc/debian_version && echo host || echo container)'",
        f"srun -n1 sh -c \"$where\" : -n1 --container-image={registry_image} sh -c \"$where\"",
        ""])
    cluster.sbatch_wait([], input=script, timeout=180)
    text = out.read_text()
    out.unlink()
    assert "BATCH plain=unset group0=2" in text, text
    ranks = parse("\n".join(line for line in text.splitlines() if "STEP2" not in line and "BATCH" not in line))
    second = parse("\n".join(line for line in text.splitlines() if "STEP2" in line))
    assert [(r["RANK"], r["COMPONENT"], r["IN"]) for r in second] == [("0", "0", "host"), ("1", "1", "container")], text
    assert [(r["RANK"], r["COMPONENT"], r["OFFSET"], r["WORLD_SIZE"]) for r in ranks] == [
        ("0", "0", "0", "2"), ("1", "1", "1", "2")], ranks
    # the job's first node's NodeAddr (its name was given before); which node that is, Slurm decides
    addresses = {cluster.box.node_address(node) for node in cluster.nodes}
    assert len({r["MASTER"] for r in ranks}) == 1 and ranks[0]["MASTER"].split(":")[0] in addresses, ranks
    assert [r["NODE_RANK"] for r in ranks] == ["0", "1"] and {r["NNODES"] for r in ranks} == {"2"}

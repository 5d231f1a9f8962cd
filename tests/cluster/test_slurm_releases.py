"""Issue 20: the same tether on Slurm 24.11 (Debian 13) and 26.05 (Debian testing), each in the
sandbox's Debian root of its own (release_cluster, one run per release).

tether is installed there from its Debian package built for that release (``tools/deb.py
--slurm-release``: the plugins built against that release's headers and Debian's Python), with the
README's package steps, and these tests run its real sbatch/srun/scontrol as the job user. What differs from
22.05 is checked where it shows: the version checks of the C shims (hostlist_t, job_modify's
err_msg, spank_prepend_task_argv, 25.11's job_desc step_id) and the gres spelling of the
job_submit handler.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from helpers import wait_until

from tether.system.toolchain import PACKAGED_BUILD_STAMP

pytestmark = pytest.mark.cluster


def test_the_plugins_are_built_for_and_run_in_the_release(release_cluster):
    box = release_cluster.box
    release = box.release()
    name, version = release_cluster.run(["sinfo", "-V"]).stdout.split()
    assert name == "slurm-wlm" and version.startswith(release + "."), version
    # from the package built for this release, as a site installs it
    package = release_cluster.run(["dpkg-query", "-W", "-f", "${Package} ${Status}", f"tether-slurm{release}"]).stdout
    assert package == f"tether-slurm{release} install ok installed", package
    stamp = json.loads(box.host_path(PACKAGED_BUILD_STAMP).read_text())
    assert stamp["toolchain"]["slurm_version"] == version, stamp
    assert stamp["toolchain"]["python_home"] == "/usr", stamp      # the root's own Python
    plugstack = box.plugstack_conf.read_text()
    assert f"required {stamp['plugin_dir']}/spank_tether.so " in plugstack, plugstack     # the package's plugin
    assert not box.host_path("/usr/local/bin/tether").exists()     # no copy of tether beside it
    log = (release_cluster.box.log_dir / "slurmctld.log").read_text()
    assert f"slurmctld version {version} started" in log
    assert "job_submit/tether: configuration loaded from" in log


def test_slots_become_ranks_with_their_environment_and_directories(release_cluster):
    out = release_cluster.as_user(["srun", "--slots=3", "--slot-type=cpu", "--slots-per-node=1", "sh", "-c",
                                   "echo $SLURM_JOB_ID $SLURMD_NODENAME $RANK $WORLD_SIZE $LOCAL_RANK $TETHER_RANK_DIR "
                                   "$MASTER_ADDR $(getent hosts $MASTER_ADDR | cut -d' ' -f1)"]).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[1:5] for r in rows] == [[node, str(i), "3", "0"] for i, node in enumerate(release_cluster.nodes)], out
    # one MASTER_ADDR: the first node's NodeAddr (by NodeName: slurm_conf_get_nodeaddr misses it)
    first = release_cluster.box.node_address(release_cluster.nodes[0])
    assert {tuple(r[6:]) for r in rows} == {(first, first)}, out
    job = rows[0][0]
    for _, node, rank, _, _, rank_dir, *_ in rows:
        assert rank_dir == str(release_cluster.box.root / "jobs" / job / node / "step-0" / f"rank-{rank}"), rows


def test_gpu_slots_are_written_in_the_new_gres_spelling_and_bound(release_cluster):
    job = release_cluster.as_user(["sbatch", "--parsable", "-H", "-p", "gpu", "--slots=2", "--slot-type=cuda",
                                "--wrap", "true"]).stdout.strip()
    try:
        assert release_cluster.job_fields(job)["TresPerJob"] == "gres/gpu:2"     # 22.05: gres:gpu:2
    finally:
        release_cluster.run(["scancel", job])
    out = release_cluster.as_user(["srun", "-p", "gpu", "--slots=2", "--slot-type=cuda", "sh", "-c",
                                "echo $CUDA_VISIBLE_DEVICES $TETHER_SLOT_IDS"]).stdout
    assert out.split() == ["0,1", "0,1"], out


def test_a_refused_update_tells_the_user_tethers_reason(release_cluster):
    """From 23.02 job_modify has err_msg: scontrol prints tether's reason (22.05 only "not supported").
    A partition change tether re-plans is made. Slurm may answer a pending job's update with
    EAGAIN ("Resource temporarily unavailable", plain jobs too, seen on both releases, while it
    looks at the new job): that is asked again, as it says."""
    job = release_cluster.as_user(["sbatch", "--parsable", "--begin=now+1hour", "--slots=2", "--slot-type=cpu",
                                   "--wrap", "true"]).stdout.strip()
    try:
        refused = release_cluster.as_user(["scontrol", "update", f"JobId={job}", "NumNodes=3"], check=False)
        assert refused.returncode == 1, refused
        assert ("scontrol: error: tether: update refused: --nodes=3 would override the layout tether planned "
                "from --slots") in refused.stderr, refused.stderr
        assert release_cluster.job_fields(job)["NumNodes"] == "2-2"                 # unchanged
        tries = []

        def moved() -> bool:
            tries.append(release_cluster.as_user(["scontrol", "update", f"JobId={job}", "Partition=aux"],
                                                 check=False))
            return tries[-1].returncode == 0 or "temporarily unavailable" not in tries[-1].stderr

        assert wait_until(moved, timeout=30, step=1), tries[-1]
        assert tries[-1].returncode == 0 and release_cluster.job_fields(job)["Partition"] == "aux", tries[-1]
    finally:
        release_cluster.run(["scancel", job])


def test_a_container_step_gets_the_tasks_own_command_through_the_prepended_launcher(release_cluster):
    """From 23.11 the SPANK plugin puts the launcher in front of the task's argv
    (spank_prepend_task_argv) instead of replacing argv[0]: the command and every argument
    arrive unchanged, in the container (the root's own podman)."""
    image = release_cluster.box.busybox_image()
    script = ('echo "$SLURM_PROCID $RANK [$0]$(printf "[%s]" "$@") '
              '$(if [ -e /usr/bin/podman ]; then echo host; else echo image; fi)"')
    result = release_cluster.as_user(["srun", "-N2", "-n2", f"--container-image={image}", "sh", "-c", script,
                                   "first", "a b", "c"], timeout=180)
    lines = sorted(result.stdout.splitlines())
    assert lines == ["0 0 [first][a b][c] image", "1 1 [first][a b][c] image"], result.stdout + result.stderr


def _next_version(deb, out) -> tuple:
    """The same package as the next version (its files and scripts, a higher Version): what an
    upgrade installs. (path, version)"""
    tree = out / "tree"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True, timeout=120)
    control = tree / "DEBIAN" / "control"
    text = control.read_text()
    version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
    newer = version.replace("-1", "+upgrade-1") if version.endswith("-1") else version + "+upgrade"
    control.write_text(text.replace(f"Version: {version}\n", f"Version: {newer}\n"))
    path = out / "newer.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(path)], check=True,
                   capture_output=True, timeout=300)
    return path, newer


def test_upgrading_the_package_under_a_running_container_step(release_cluster, tmp_path):
    """Issue 41, the README's "Upgrade tether": `dpkg -i` of the next version while a container
    step runs. The running step ends as it began (its launcher's files were replaced by new
    inodes, never rewritten), the job's next step runs with the new files, and so does a new job."""
    box = release_cluster.box
    assert box.package, "a release sandbox installs tether from its package"
    newer, version = _next_version(box.package, tmp_path)
    image = box.busybox_image()
    out = box.work_dir / f"upgrade-{box.release()}.out"
    out.unlink(missing_ok=True)
    packaged = box.loaded_plugin_dir() / "tether-run"
    # the launcher `tether slurm install --write` built for the sandbox's config (outside dpkg's files)
    named = re.search(r" launcher=(\S+) ", box.plugstack_conf.read_text()).group(1)
    launcher = box.host_path(named)
    assert launcher.parent != packaged.parent, named
    before = (packaged.stat().st_ino, launcher.stat().st_ino)
    # the first step runs until the test lets it end: the upgrade happens while it runs, whatever the load
    steps = (f"srun --container-image={image} sh -c 'while [ ! -e $TETHER_WORK_DIR/go ]; do sleep 0.2; done; "
             f"echo first-step-done'; srun --container-image={image} echo second-step-done")
    job = release_cluster.submit("-N1", "-o", str(out), "--wrap", steps)
    staged = box.slurm_root.path / "root/tether-upgrade.deb"           # root's own, in the root
    try:
        assert wait_until(lambda: f"{job}.0 " in release_cluster.run(["squeue", "-h", "-s", "-j", job, "-o",
                                                                      "%i "]).stdout, timeout=120, step=0.5)
        shutil.copy(newer, staged)
        upgraded = release_cluster.run(["dpkg", "-i", "/root/tether-upgrade.deb"], timeout=300)
        assert "Preparing to unpack" in upgraded.stdout, upgraded.stdout
        box.install_plugins(log=lambda m: None)       # the README's next step: the launcher, again
        assert packaged.stat().st_ino != before[0] and launcher.stat().st_ino != before[1]
        assert f"{job}.0 " in release_cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i "]).stdout
        node = release_cluster.job_fields(job)["NodeList"]
        go = box.root / "jobs" / job / node / "step-0" / "rank-0" / "work" / "go"
        go.write_text("")                             # the first step may end now
        go.chmod(0o644)
        fields = release_cluster.wait_job(job, timeout=240)
        text = out.read_text()
        assert fields["JobState"] == "COMPLETED", (fields, text)
        assert "first-step-done" in text and "second-step-done" in text, text
        installed = release_cluster.run(["dpkg-query", "-W", "-f", "${Version}", f"tether-slurm{box.release()}"])
        assert installed.stdout == version
        again = release_cluster.as_user(["srun", f"--container-image={image}", "echo", "a-new-job"], timeout=180)
        assert again.stdout.strip() == "a-new-job", again.stdout + again.stderr
    finally:
        staged.unlink(missing_ok=True)
        release_cluster.run(["scancel", job], check=False)
        box.install_package()                  # the package the sandbox was started with, again
        box.install_plugins(log=lambda m: None)

"""Each user's own directories on a node, through the real daemons (issue 39, finding 5; issue 46's
login environment): root (the SPANK plugin in slurmstepd) makes them where only root writes, so no
user can take another's first, and podman's run directory never comes from the job's environment."""

from __future__ import annotations

import os
import pwd
import shutil

import pytest

from tether.hooks.layout import USER_RUN_ROOT

pytestmark = pytest.mark.cluster


def _plant(path, owner: int) -> None:
    """``path`` made by another user first, writable by all (as the red team did)."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.islink(path):
        os.unlink(path)
    os.mkdir(path, 0o777)
    os.chmod(path, 0o777)
    os.chown(path, owner, owner)


def test_another_user_cannot_deny_a_users_containers_and_login_variables_change_nothing(cluster, image):
    """Another user made the victim's old store and run directory names (/var/tmp/tether-podman-<uid>,
    /tmp/podman-run-<uid>) before the victim's first job: every container step of the victim failed
    with exit 125. And a job submitted from a login shell carries the login node's
    XDG_RUNTIME_DIR: podman's records then disagreed with the next job's ("database configuration
    mismatch", exit 125). Now the victim's steps run, with and without a login environment, in
    any order; the user's directories are root's making, the user's own, 0700."""
    user = pwd.getpwnam(cluster.user)
    nobody = pwd.getpwnam("nobody").pw_uid
    box = cluster.box
    node = cluster.nodes[0]
    planted = [box.node_path(node, f"/var/tmp/tether-podman-{user.pw_uid}"),
               box.node_path(node, f"/tmp/podman-run-{user.pw_uid}")]
    try:
        for path in planted:
            _plant(path, nobody)
        login = ["env", f"XDG_RUNTIME_DIR=/run/user/{user.pw_uid}",
                 f"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{user.pw_uid}/bus"]
        plain = ["env", "-u", "XDG_RUNTIME_DIR"]
        for how in (plain, login, plain, login):
            result = cluster.as_user([*how, "srun", "-N1", "-w", cluster.nodes[0], f"--container-image={image}",
                                      "sh", "-c", "echo in=$(id -u)"], check=False)
            assert result.returncode == 0, result.stderr
            assert f"in={user.pw_uid}" in result.stdout
        for base in (USER_RUN_ROOT, str(box.store_base)):
            mine = box.node_path(node, f"{base}/{user.pw_uid}")
            st = os.lstat(mine)
            assert (st.st_uid, st.st_mode & 0o7777) == (user.pw_uid, 0o700), mine
            parent = os.lstat(os.path.dirname(mine))
            assert parent.st_uid == 0 and not parent.st_mode & 0o022
        for path in planted:          # never used: still the other user's, empty
            assert os.lstat(path).st_uid == nobody and os.listdir(path) == []
    finally:
        for path in planted:
            shutil.rmtree(path, ignore_errors=True)


def test_a_base_others_can_write_fails_the_step_clearly_and_drains_nothing(cluster, image):
    """Root makes a user's directory only in a base that root owns and nobody else can write; one
    that others can write (an admin's mistake, or a path under /tmp) fails the container step with
    the reason, and the node stays in service."""
    users = cluster.box.node_path(cluster.nodes[0], cluster.box.store_base)
    os.makedirs(users, mode=0o755, exist_ok=True)
    os.chmod(users, 0o777)
    try:
        result = cluster.as_user(["srun", "-N1", "-w", cluster.nodes[0], f"--container-image={image}", "true"],
                                 check=False)
    finally:
        os.chmod(users, 0o755)
    assert result.returncode != 0
    assert "must be owned by root and not writable by group or others" in result.stderr
    assert cluster.in_service(), cluster.node_states()


def test_a_launch_scripts_tether_run_gets_the_users_directories_too(cluster, image, tmp_path):
    """A per-node launch script (`tether plan`, the launcher) runs `srun ... tether run IMAGE`: to
    slurmstepd no container step, so it made no directory for the user, and on a node where the
    user had never run a container step every `tether run` failed ("... does not exist"). The
    script asks slurmstepd for them (TETHER_RUN_USER_DIRS); here on nodes the user never used."""
    user = pwd.getpwnam(cluster.user)
    box = cluster.box
    mine = [box.node_path(node, f"{base}/{user.pw_uid}") for node in cluster.nodes
            for base in (USER_RUN_ROOT, str(box.store_base))]
    box.cool_nodes()                  # the pause processes first: their records go with the directories
    for path in mine:                 # as after the node's boot: nothing of the user's there
        shutil.rmtree(path, ignore_errors=True)
    spec = tmp_path / "job.yaml"
    spec.write_text("resource_pool: null\nslots_per_trial: 3\nslot_type: cpu\nslurm: {slots_per_node: 1}\n")
    out = box.work_dir / f"launch-user-dirs-{os.getpid()}"
    script = cluster.run([*box.tether, "plan", "--config", str(box.tether_conf), str(spec),
                          f"--container-image={image}", f"--log-dir={out}", "--", "sh", "-c",
                          "echo node=$SLURMD_NODENAME uid=$(id -u)"]).stdout
    out.mkdir()
    os.chown(out, user.pw_uid, user.pw_gid)
    (out / "job.sh").write_text(script)
    job = cluster.submit(str(out / "job.sh"), env={"TETHER_CONFIG": str(box.tether_conf)})
    assert cluster.wait_job(job)["JobState"] == "COMPLETED", (out / "job.err").read_text()
    assert sorted((out / "job.out").read_text().split("\n")[:-1]) == [f"node={n} uid={user.pw_uid}" for n in cluster.nodes]
    for path in mine:
        st = os.lstat(path)
        assert (st.st_uid, st.st_mode & 0o7777) == (user.pw_uid, 0o700), path
    shutil.rmtree(out, ignore_errors=True)

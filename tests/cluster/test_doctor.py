"""``tether doctor`` against the real sandbox: all ok when healthy; each injected misconfiguration
named in its own FAIL line (issue 15)."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

pytestmark = pytest.mark.cluster


def doctor(cluster, config, *extra: str, slurm_conf=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": str(slurm_conf or cluster.box.slurm_conf)}
    env.pop("TETHER_CONFIG", None)
    return subprocess.run(cluster.box.wrap([*cluster.box.tether, "doctor", "--config", str(config), *extra]),
                          capture_output=True, text=True, env=env, timeout=120)


def variant(cluster, tmp_path, name: str, change) -> str:
    """A copy of the sandbox's tether.yaml with ``change(data)`` applied."""
    data = yaml.safe_load(cluster.box.tether_conf.read_text())
    change(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_doctor_on_the_healthy_sandbox_says_all_ok(cluster):
    result = doctor(cluster, cluster.box.tether_conf, "--user", cluster.user)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")], result.stdout
    for name in ("config", "slurm", "slurm.conf", "plugins", "plugstack.conf", "slurmctld", "job_storage_root",
                 "runtime podman", f"user {cluster.user}", "cdi", "ports"):
        assert any(line.startswith(f"ok    {name}:") for line in lines), (name, result.stdout)
    assert "all ok" in lines[-1]


def _storage(tmp_path):
    def change(data):
        loose = tmp_path / "loose-storage"
        loose.mkdir(exist_ok=True)
        os.chmod(loose, 0o777)
        data["job_storage_root"] = str(loose)
    return change


def _no_cdi(tmp_path):
    def change(data):
        (tmp_path / "cdi").mkdir(exist_ok=True)
        data["container"]["podman"]["cdi_spec_dirs"] = [str(tmp_path / "cdi")]
    return change


@pytest.mark.parametrize("case,expected", [
    ("bad-config", "FAIL  config: "),
    ("no-plugstack-line", "FAIL  plugstack.conf: no spank_tether.so line"),
    ("unsafe-storage", "FAIL  job_storage_root: "),
    ("missing-runtime", "FAIL  runtime podman: /nonexistent/podman not found"),
    ("no-cdi-spec", "FAIL  cdi: GPU slots are configured but no CDI spec for sandbox.tether/gpu"),
    ("user-without-subuid", "FAIL  user daemon: no range in /etc/subuid"),
    ("other-config", "FAIL  slurmctld: its job_submit plugin reads"),
])
def test_doctor_names_each_misconfiguration(cluster, tmp_path, case, expected):
    config, slurm_conf, extra = str(cluster.box.tether_conf), None, ["--user", cluster.user]
    if case == "bad-config":
        config = str(tmp_path / "bad.yaml")
        (tmp_path / "bad.yaml").write_text("slots_type: cuda\n")
    elif case == "no-plugstack-line":
        (tmp_path / "plugstack.conf").write_text("# nothing here\n")
        slurm_conf = tmp_path / "slurm.conf"
        slurm_conf.write_text(cluster.box.slurm_conf.read_text() + f"\nPlugStackConfig={tmp_path}/plugstack.conf\n")
    elif case == "unsafe-storage":
        config = variant(cluster, tmp_path, case, _storage(tmp_path))
    elif case == "missing-runtime":
        config = variant(cluster, tmp_path, case,
                         lambda d: d["container"]["podman"].__setitem__("binary", "/nonexistent/podman"))
    elif case == "no-cdi-spec":
        config = variant(cluster, tmp_path, case, _no_cdi(tmp_path))
    elif case == "user-without-subuid":
        extra = ["--user", "daemon"]
    elif case == "other-config":
        config = variant(cluster, tmp_path, case, lambda d: None)
    result = doctor(cluster, config, *extra, slurm_conf=slurm_conf)
    assert result.returncode == 1, result.stdout
    assert any(line.startswith(expected) for line in result.stdout.splitlines()), result.stdout
    assert "failed" in result.stdout.splitlines()[-1]

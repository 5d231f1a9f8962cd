"""``tether doctor`` on a host where tether came from its Debian package (issue 41): the advice for
missing or mismatched plugins is the package's, never an install over the package's own files."""

from __future__ import annotations

import pytest

from tether.admin import doctor as doctor_module
from tether.admin.doctor import FAIL, Doctor, packaged_by


def test_the_package_that_installed_a_file_is_dpkgs_answer():
    # python3-yaml is one of the package's dependencies (tests/bootstrap installs it)
    assert packaged_by("/usr/lib/python3/dist-packages/yaml/__init__.py") == "python3-yaml"
    assert packaged_by("/opt/tether/venv/lib/python3.11/site-packages/tether/admin/doctor.py") is None
    assert packaged_by("/usr/lib/python3/dist-packages/tether-nobody-owns/x.py") is None


@pytest.mark.parametrize("package", [None, "tether-slurm22.05"])
def test_missing_plugins_are_advised_as_this_host_installed_tether(tmp_path, monkeypatch, package):
    monkeypatch.setattr(doctor_module, "packaged_by", lambda: package)
    monkeypatch.setattr(Doctor, "_plugin_dir", lambda self: tmp_path)
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == FAIL and "missing: " in finding.detail and str(tmp_path) in finding.detail
    if package:
        assert f"`apt-get install --reinstall {package}`" in finding.detail
        assert "tether slurm install" not in finding.detail
    else:
        assert finding.detail.endswith("`tether slurm build`, then `tether slurm install --write`")


def test_the_packages_build_stamp_is_what_the_plugins_are_checked_against(tmp_path, monkeypatch):
    """A package host has no build of its own (and often no compiler or headers: finding one
    fails): the doctor checks the plugins against the package's record of its build."""
    from tether.admin.doctor import OK
    from tether.system.toolchain import BuildError

    def no_toolchain(*_a, **_k):
        raise BuildError("Slurm's headers were not found")

    for name in ("spank_tether.so", "job_submit_tether.so", "tether-run", "tether-run-py"):
        (tmp_path / name).write_text("x")
    monkeypatch.setattr(doctor_module, "default_build_dir", no_toolchain)
    monkeypatch.setattr(doctor_module, "installed_slurm_version", lambda: "22.05.8")
    monkeypatch.setattr(Doctor, "_plugin_dir", lambda self: tmp_path)
    stamp = {"plugin_dir": str(tmp_path), "files": ["spank_tether.so", "job_submit_tether.so"],
             "toolchain": {"slurm_version": "22.05.8"}}
    monkeypatch.setattr(doctor_module, "packaged_stamp", lambda: stamp)
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == OK and finding.detail.endswith("built for Slurm 22.05.8"), finding
    stamp["toolchain"]["slurm_version"] = "22.05.7"
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == FAIL and "built for Slurm 22.05.7, but Slurm 22.05.8 is installed" in finding.detail
    monkeypatch.setattr(doctor_module, "packaged_stamp", lambda: None)       # no package, no toolchain
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == OK and "built for" not in finding.detail


def test_the_launcher_is_looked_for_where_the_plugstack_line_names_it(tmp_path, monkeypatch):
    """On a package host `tether slurm install --write` builds the launcher for the site's config
    outside the package's plugin directory; the doctor checks the one the SPANK line names."""
    from tether.admin.doctor import OK

    plugins, launchers = tmp_path / "plugins", tmp_path / "launcher"
    plugins.mkdir()
    launchers.mkdir()
    (plugins / "spank_tether.so").write_text("x")
    line = f"required {plugins}/spank_tether.so job_storage_root=/j launcher={launchers}/tether-run user_dirs=/run/tether"
    monkeypatch.setattr(Doctor, "_plugstack_line", lambda self: line)
    monkeypatch.setattr(Doctor, "_plugin_dir", lambda self: plugins)
    monkeypatch.setattr(doctor_module, "packaged_stamp", lambda: None)
    monkeypatch.setattr(doctor_module, "read_stamp", lambda build: (_ for _ in ()).throw(doctor_module.BuildError("none")))
    monkeypatch.setattr(doctor_module, "default_build_dir", lambda: tmp_path / "nobuild")
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == FAIL and f"{launchers}/tether-run, {launchers}/tether-run-py missing" in finding.detail
    for name in ("tether-run", "tether-run-py"):
        (launchers / name).write_text("x")
    (finding,) = list(Doctor(None).check_plugins())
    assert finding.status == OK and f"in {plugins}, tether-run and tether-run-py in {launchers}" in finding.detail


def test_the_admins_container_batch_reaches_the_plugstack_line_and_the_doctor_compares_them(tmp_path, monkeypatch):
    """container.batch: true (pyxis's sbatch_support) is the SPANK plugin's container_batch=1; a
    plugstack line that disagrees with the config is a finding, as the other settings are."""
    from pathlib import Path

    from tether.admin.slurm import SlurmConf, plugstack_line
    from tether.hooks.config import validate_config

    site = validate_config({"container": {"batch": True}}, "t")
    assert plugstack_line(Path("/p"), site).endswith(" container_batch=1")
    assert "container_batch" not in plugstack_line(Path("/p"), validate_config({}, "t"))
    doctor = Doctor(None)
    doctor.conf = SlurmConf(tmp_path / "slurm.conf", (), tmp_path / "plugstack.conf", (), tmp_path / "pid")
    for config, line in ((validate_config({}, "t"), plugstack_line(Path("/p"), site)),
                         (site, plugstack_line(Path("/p"), validate_config({}, "t")))):
        doctor.config = config
        monkeypatch.setattr(Doctor, "_plugstack_line", lambda self, line=line: line)
        (finding,) = list(doctor.check_plugstack())
        assert finding.status == FAIL and "container_batch=" in finding.detail and "container.batch: " in finding.detail

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
    assert finding.status == FAIL and "missing in" in finding.detail
    if package:
        assert f"`apt-get install --reinstall {package}`" in finding.detail
        assert "tether slurm install" not in finding.detail
    else:
        assert finding.detail.endswith("`tether slurm build`, then `tether slurm install --write`")

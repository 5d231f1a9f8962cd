"""``tether doctor`` on what enroot's `import` needs and on plain-http registries (issue 41): each
finding fails on the doctor that did not look."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import yaml

from tether.admin.doctor import (CAP_MKNOD, CAP_SYS_ADMIN, ENROOT_HELPERS, ENROOT_TOOLS, OK, WARN, Doctor,
                                 file_capabilities)


def _doctor(tmp_path: Path, data: dict) -> Doctor:
    config = tmp_path / "tether.yaml"
    config.write_text(yaml.safe_dump(data))
    doctor = Doctor(str(config), slurm_conf=str(tmp_path / "no-slurm.conf"))
    list(doctor.check_config())
    return doctor


def _enroot(tmp_path: Path, helpers=ENROOT_HELPERS, tools=(t for t, _ in ENROOT_TOOLS)) -> Path:
    """An enroot install: the script and the helpers named beside it; the tools in a bin of their own."""
    bin_dir, tool_dir = tmp_path / "enroot-bin", tmp_path / "tools"
    bin_dir.mkdir()
    tool_dir.mkdir()
    for name, where in [("enroot", bin_dir), *((h, bin_dir) for h in helpers), *((t, tool_dir) for t in tools)]:
        path = where / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return bin_dir / "enroot"


def _setcap(path: Path, caps: tuple[int, ...], effective: bool = True) -> None:
    """What `setcap cap_...+pe PATH` writes: vfs_cap_data revision 2 (magic, then permitted and
    inheritable for the low and the high 32 capabilities)."""
    mask = sum(1 << c for c in caps)
    magic = 0x02000000 | (1 if effective else 0)
    os.setxattr(path, "security.capability", struct.pack("<5I", magic, mask & 0xFFFFFFFF, 0, mask >> 32, 0))


@pytest.fixture
def path_of(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "tools"))        # this host's own tools unseen
    monkeypatch.delenv("CONTAINERS_REGISTRIES_CONF", raising=False)
    for name in ("ENROOT_ALLOW_HTTP", "SINGULARITY_NOHTTPS", "APPTAINER_NOHTTPS"):
        monkeypatch.delenv(name, raising=False)


def test_capabilities_are_read_as_setcap_writes_them(tmp_path):
    f = tmp_path / "helper"
    f.write_text("")
    assert file_capabilities(str(f)) == set()
    _setcap(f, (CAP_SYS_ADMIN, CAP_MKNOD))
    assert file_capabilities(str(f)) == {CAP_SYS_ADMIN, CAP_MKNOD}
    _setcap(f, (CAP_SYS_ADMIN,), effective=False)             # +p only: not raised at exec
    assert file_capabilities(str(f)) == set()


def test_enroot_with_its_helpers_tools_and_capabilities_is_ok(tmp_path, path_of):
    enroot = _enroot(tmp_path)
    _setcap(enroot.parent / "enroot-aufs2ovlfs", (CAP_SYS_ADMIN, CAP_MKNOD))
    _setcap(enroot.parent / "enroot-mksquashovlfs", (CAP_SYS_ADMIN,))
    findings = list(_doctor(tmp_path, {"container": {"enroot": {"binary": str(enroot)}}}).check_enroot())
    assert [(f.status, f.name) for f in findings] == [(OK, "enroot helpers")], findings


def test_enroot_without_a_helper_a_tool_or_the_capabilities_is_named(tmp_path, path_of):
    """Before: `tether doctor` said "runtime enroot: ok" and a user's first registry image failed."""
    enroot = _enroot(tmp_path, helpers=[h for h in ENROOT_HELPERS if h != "enroot-nsenter"],
                     tools=[t for t, _ in ENROOT_TOOLS if t not in ("jq", "mksquashfs")])
    _setcap(enroot.parent / "enroot-aufs2ovlfs", (CAP_SYS_ADMIN,))             # cap_mknod missing
    doctor = _doctor(tmp_path, {"container": {"runtime": "enroot", "enroot": {"binary": str(enroot)}}})
    lines = {f.name: (f.status, f.detail) for f in doctor.check_enroot()}
    assert lines["enroot helpers"][0] == "FAIL" and "enroot-nsenter not found" in lines["enroot helpers"][1]
    assert "jq (jq), mksquashfs (squashfs-tools)" in lines["enroot tools"][1]
    caps = lines["enroot capabilities"][1]
    assert "enroot-aufs2ovlfs (cap_sys_admin+cap_mknod)" in caps and "enroot-mksquashovlfs (cap_sys_admin)" in caps
    assert "enroot+caps" in caps


def test_no_enroot_no_enroot_findings(tmp_path, path_of):
    doctor = _doctor(tmp_path, {"container": {"enroot": {"binary": str(tmp_path / "none" / "enroot")}}})
    assert list(doctor.check_enroot()) == []


def test_a_plain_http_registry_is_explained_for_each_runtime_not_told(tmp_path, path_of):
    """Podman's registries.conf marks the site registry insecure; enroot and singularity are
    installed, singularity told (SINGULARITY_NOHTTPS in its env), enroot not: the warning names
    ENROOT_ALLOW_HTTP and what enroot says without it (recorded: curl's exit 35)."""
    conf = tmp_path / "registries.conf"
    conf.write_text('[[registry]]\nlocation = "reg.site:5000"\ninsecure = true\n\n'
                    '[[registry]]\nlocation = "docker.io"\n')
    enroot = _enroot(tmp_path)
    singularity = enroot.parent / "singularity"
    singularity.write_text("#!/bin/sh\n")
    singularity.chmod(0o755)
    doctor = _doctor(tmp_path, {"container": {
        "podman": {"env": {"CONTAINERS_REGISTRIES_CONF": str(conf)}},
        "enroot": {"binary": str(enroot)},
        "singularity": {"binary": str(singularity), "env": {"SINGULARITY_NOHTTPS": "1"}},
        "apptainer": {"binary": str(tmp_path / "none" / "apptainer")}}})
    lines = {f.name: (f.status, f.detail) for f in doctor.check_plain_http()}
    assert set(lines) == {"enroot plain http", "singularity plain http"}, lines
    assert lines["singularity plain http"][0] == OK
    status, detail = lines["enroot plain http"]
    assert status == WARN and "reg.site:5000 speaks plain http" in detail and "docker.io" not in detail
    assert 'container.enroot.env.ENROOT_ALLOW_HTTP: "y"' in detail and "exit 35" in detail
    conf.write_text('[[registry]]\nlocation = "docker.io"\n')
    assert list(doctor.check_plain_http()) == []

"""``tether doctor`` on what enroot's `import` needs and on plain-http registries (issue 41): each
finding fails on the doctor that did not look."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import yaml

from tether.admin.doctor import (CAP_MKNOD, CAP_SYS_ADMIN, ENROOT_HELPERS, ENROOT_TOOLS, OK, WARN, Doctor,
                                 file_capabilities, plain_http_registries, told)


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
    mask = 1 << CAP_SYS_ADMIN
    # revision 3: the host's (root id 0), or a user namespace's (setcap inside a container: nothing here)
    os.setxattr(f, "security.capability", struct.pack("<6I", 0x03000001, mask, 0, 0, 0, 0))
    assert file_capabilities(str(f)) == {CAP_SYS_ADMIN}
    os.setxattr(f, "security.capability", struct.pack("<6I", 0x03000001, mask, 0, 0, 0, 1000))
    assert file_capabilities(str(f)) == set()



def test_capability_revisions_the_kernel_no_longer_writes_are_read_too(monkeypatch):
    """Revision 1 (one word, the kernel converts it on write now) still reads; an unknown revision
    or a length that does not match its revision reads as none."""
    mask = 1 << CAP_SYS_ADMIN
    for raw, expected in ((struct.pack("<3I", 0x01000001, mask, 0), {CAP_SYS_ADMIN}),
                          (struct.pack("<5I", 0x07000001, mask, 0, 0, 0), set()),
                          (struct.pack("<4I", 0x02000001, mask, 0, 0), set())):
        monkeypatch.setattr(os, "getxattr", lambda path, name, raw=raw: raw)
        assert file_capabilities("/x") == expected, raw


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


def test_a_plain_http_registry_is_explained_for_each_runtime_with_what_the_setting_costs(tmp_path, path_of):
    """Podman's registries.conf marks the site registry insecure; enroot and singularity are
    installed, singularity told (SINGULARITY_NOHTTPS in its env), enroot not. Neither finding
    advises the setting lightly: it is not per registry (found in review: enroot then fetches
    docker.io over http too, tokens in clear); the registry over TLS is the fix named first."""
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
    status, detail = lines["singularity plain http"]
    assert status == WARN and "SINGULARITY_NOHTTPS=1 lets singularity use reg.site:5000" in detail
    assert "every registry" in detail
    status, detail = lines["enroot plain http"]
    assert status == WARN and "reg.site:5000 speaks plain http" in detail and "docker.io" not in detail.split(";")[0]
    assert "Serve the registry over TLS" in detail and "ENROOT_ALLOW_HTTP=y (container.enroot.env)" in detail
    assert "exit 35" in detail and "every registry" in detail
    conf.write_text('[[registry]]\nlocation = "docker.io"\n')
    assert list(doctor.check_plain_http()) == []


def test_plain_http_registries_in_drop_ins_and_the_older_format_and_bad_files(tmp_path):
    conf = tmp_path / "registries.conf"
    conf.write_bytes(b"\xff\xfe not toml")                              # neither UTF-8 nor TOML
    (tmp_path / "registries.conf.d").mkdir()
    (tmp_path / "registries.conf.d" / "10-site.conf").write_text(
        '[[registry]]\nprefix = "a.site"\nlocation = "a.site:80"\ninsecure = true\n')
    (tmp_path / "registries.conf.d" / "20-old.conf").write_text(
        '[registries.insecure]\nregistries = ["b.site:5000", "a.site:80"]\n')
    (tmp_path / "registries.conf.d" / "30-broken.conf").write_text("[[registry]\n")
    assert plain_http_registries(str(conf)) == ["a.site:80", "b.site:5000"]


def test_the_runtimes_read_their_plain_http_switch_as_they_do():
    """enroot tests for a non-empty value; Singularity and Apptainer parse a boolean."""
    assert told("enroot", "y") and told("enroot", "no") and not told("enroot", "") and not told("enroot", None)
    assert told("singularity", "1") and told("apptainer", "true")
    assert not told("singularity", "0") and not told("apptainer", "no") and not told("singularity", None)


def test_a_runtime_adapter_that_cannot_load_is_not_called_unknown(monkeypatch):
    """Issue 42: an adapter whose own import fails (a module it needs is missing) was reported as
    "unknown container runtime 'podman'", sending the user after a typo that was never there."""
    import builtins
    import sys

    from tether.container.runtimes import adapter
    from tether.container.spec import LaunchError

    real_import = builtins.__import__

    def broken(name, *args, **kw):
        if name == "tether.container.runtimes.podman":
            raise ModuleNotFoundError("No module named 'tether_gone'", name="tether_gone")
        return real_import(name, *args, **kw)
    monkeypatch.delitem(sys.modules, "tether.container.runtimes.podman", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(LaunchError, match=r"^the podman runtime's adapter cannot be loaded: No module named "
                                          r"'tether_gone' \(an installation problem: tell an admin\)$"):
        adapter("podman", {})
    monkeypatch.setattr(builtins, "__import__", real_import)
    with pytest.raises(LaunchError, match=r"^unknown container runtime 'dockerish'$"):
        adapter("dockerish", {})


def test_the_cluster_store_checks_say_what_a_node_lacks(tmp_path):
    """container.cluster_store: no check without one; an account that does not exist, a store
    someone else owns, no image service on the node -- each said (the store's own, with a
    service socket: no complaint but what the node itself lacks)."""
    import socket as socketlib

    from tether.admin.doctor import FAIL

    def store_findings(conf):
        doctor = _doctor(tmp_path, {"container": {"cluster_store": conf}})
        return [(f.status, f.detail) for f in doctor.check_cluster_store()]

    assert list(_doctor(tmp_path, {}).check_cluster_store()) == []
    missing = store_findings({"root": str(tmp_path / "store"), "account": "no-such-account-here"})
    assert missing == [(FAIL, "its account no-such-account-here does not exist on this host "
                              "(README: The cluster image store)")]
    assert store_findings({"root": str(tmp_path / "store"), "account": "root"}) == [
        (FAIL, "its account is root's: the store and its service need an account of their own (never root)")]
    root = tmp_path / "store"
    for name in ("", "images"):
        (root / name).mkdir(exist_ok=True)
        os.chown(root / name, 1, 1)                           # daemon's, not the account's
    sock = tmp_path / "images.sock"
    server = socketlib.socket(socketlib.AF_UNIX)
    server.bind(str(sock))
    try:
        found = store_findings({"root": str(root), "account": "nobody", "socket": str(sock)})
    finally:
        server.close()
    assert found[0][0] == FAIL and "cannot be trusted" in found[0][1] and "daemon" in found[0][1]
    for name in ("", "images"):
        os.chown(root / name, 65534, 65534)
    found = store_findings({"root": str(root), "account": "nobody", "socket": str(tmp_path / "absent.sock")})
    assert found[0] == (OK, f"{root} (nobody's)")
    assert (WARN, f"no image service at {tmp_path / 'absent.sock'} on this host: its ranks pull into each user's "
                  f"own store (tether-images.socket)") in found


def test_the_cluster_store_checks_what_enroot_needs_to_start_its_images(tmp_path, monkeypatch):
    """With enroot on the node, the store's check also asks what `enroot start FILE` needs: an
    unsquashfs that reads zstd (what the store writes), mountpoint, and an overlay users may mount
    (the kernel's from 5.11, else fuse-overlayfs) -- each missing one said with its remedy."""
    from tether.admin import doctor as doctor_mod
    from tether.admin.doctor import FAIL

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "enroot").write_text("#!/bin/sh\n")
    (bin_dir / "enroot").chmod(0o755)
    root = tmp_path / "store"
    (root / "images").mkdir(parents=True)
    for path in (root, root / "images"):
        os.chown(path, 65534, 65534)
    doctor = _doctor(tmp_path, {"container": {"cluster_store": {"root": str(root), "account": "nobody"},
                                              "enroot": {"binary": str(bin_dir / "enroot")}}})

    def findings():
        return [(f.status, f.detail) for f in doctor.check_cluster_store() if "enroot" in f.detail]

    assert findings() == []                     # this machine has them all
    said = (tmp_path / "unsquashfs")
    said.write_text("#!/bin/sh\necho 'Decompressors available:'; echo '\tgzip'; echo '\txz'\n")
    said.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(doctor_mod.shutil, "which", lambda name, real=doctor_mod.shutil.which:
                        None if name in ("mountpoint", "fuse-overlayfs") else real(name))
    monkeypatch.setattr(doctor_mod.os, "uname", lambda: os.uname_result(("Linux", "n1", "4.18.0-553.el8", "", "x86_64")))
    got = findings()
    assert (FAIL, "unsquashfs cannot read zstd (or is not installed): enroot ranks cannot start the store's images "
                  "(apt install squashfs-tools)") in got
    assert any(s == FAIL and d.startswith("mountpoint is not installed") for s, d in got)
    assert any(s == WARN and "kernel 4.18.0-553.el8 lets no user mount an overlay" in d for s, d in got)

"""``tether doctor``'s port check: the ports tether derives (MASTER_PORT, gateway daemons) against
this node's ephemeral range, which an outgoing connection may hold when a rank or daemon binds."""

from __future__ import annotations

import pytest
import yaml

from tether.admin import doctor as doctor_mod
from tether.hooks.configfile import load_config


def check(tmp_path, monkeypatch, ephemeral: str, reserved: str = "", gateways: dict | None = None):
    (tmp_path / "range").write_text(ephemeral + "\n")
    (tmp_path / "reserved").write_text(reserved + "\n")
    monkeypatch.setattr(doctor_mod, "EPHEMERAL_PORTS", str(tmp_path / "range"))
    monkeypatch.setattr(doctor_mod, "RESERVED_PORTS", str(tmp_path / "reserved"))
    config = tmp_path / "tether.yaml"
    config.write_text(yaml.safe_dump({"gateways": {"daemon": ["gwd", "{port}"], **gateways}} if gateways else {}))
    doc = doctor_mod.Doctor(str(config))
    doc.config = load_config(str(config))
    return list(doc.check_ports())


def test_linux_default_range_leaves_tethers_ports_alone(tmp_path, monkeypatch):
    [finding] = check(tmp_path, monkeypatch, "32768\t60999", gateways={"partition": "gateway"})
    assert finding.status == "ok", finding
    assert "MASTER_PORT 12288-28671" in finding.detail and "gateway ports 28672-32767" in finding.detail


@pytest.mark.parametrize("ephemeral,gateways,clash", [
    ("1024\t65535", None, "MASTER_PORT 12288-28671"),                              # a wide range
    ("32768\t60999", {"partition": "gateway", "port": 40000}, "gateways.port 40000-40015"),
    ("30000\t60999", {"partition": "gateway"}, "gateway ports 28672-32767"),       # partly inside
])
def test_an_overlap_is_a_warning_naming_the_range_and_the_fix(tmp_path, monkeypatch, ephemeral, gateways, clash):
    [finding] = check(tmp_path, monkeypatch, ephemeral, gateways=gateways)
    assert finding.status == "warn" and clash in finding.detail, finding
    assert "ip_local_reserved_ports" in finding.detail


def test_reserved_ports_are_not_ephemeral(tmp_path, monkeypatch):
    [finding] = check(tmp_path, monkeypatch, "1024 65535", reserved="80,12288-32767", gateways={"partition": "g"})
    assert finding.status == "ok", finding
    [finding] = check(tmp_path, monkeypatch, "1024 65535", reserved="12288-28000", gateways={"partition": "g"})
    assert finding.status == "warn" and "MASTER_PORT" in finding.detail, finding


# ---- job users' subordinate ids, and each runtime's version (issue 41) ----------------------
def _users_check(tmp_path, monkeypatch, subuid: str, subgid: str, user: str = "nobody"):
    (tmp_path / "subuid").write_text(subuid)
    (tmp_path / "subgid").write_text(subgid)
    monkeypatch.setattr(doctor_mod, "SUBID_FILES", (str(tmp_path / "subuid"), str(tmp_path / "subgid")))
    config = tmp_path / "tether.yaml"
    config.write_text("container: {runtime: podman}\n")
    doc = doctor_mod.Doctor(str(config), users=(user,))
    doc.config = load_config(str(config))
    return list(doc.check_job_users())


def test_the_advice_for_a_user_without_subids_is_a_range_nobody_has(tmp_path, monkeypatch):
    """It advised `usermod --add-subuids 100000-165535` whatever the files held: another user's
    range here, and following it made podman fail ("newuidmap: write to uid_map failed")."""
    taken = "demo:100000:65536\nother:165536:65536\n"
    [finding] = _users_check(tmp_path, monkeypatch, taken, taken + "third:300000:65536\n")
    assert finding.status == doctor_mod.FAIL
    assert "--add-subuids 365536-431071 --add-subgids 365536-431071 nobody" in finding.detail
    [finding] = _users_check(tmp_path, monkeypatch, "", "")
    assert "--add-subuids 100000-165535" in finding.detail     # nothing taken: where useradd starts


@pytest.mark.parametrize("subuid,said", [
    ("demo:100000:65536\nnobody:165535:65536\n", "165535-231070 overlaps demo's 100000-165535"),
    ("demo:100000:65536\nnobody:100000:65536\n", "100000-165535 overlaps demo's 100000-165535"),
    ("nobody:100000:65536\n65534:120000:65536\n", "nobody has overlapping lines"),
])
def test_overlapping_and_duplicated_ranges_are_found(tmp_path, monkeypatch, subuid, said):
    [finding] = _users_check(tmp_path, monkeypatch, subuid, "nobody:500000:65536\n")
    assert finding.status == doctor_mod.FAIL and said in finding.detail and "newuidmap" in finding.detail, finding


def test_enroot_is_asked_its_version_as_enroot_answers(tmp_path, fake_runtimes):
    """The fake enroot replays what real enroot 4.1.2 did (`enroot version` prints it; `enroot
    --version` is a usage error, exit 1), and the doctor asks the way that works."""
    import json
    import os
    import subprocess

    from helpers import REPO

    recorded = json.loads((REPO / "tests/fixtures/conformance/enroot.json").read_text())["cases"]
    env = {"PATH": fake_runtimes.path_env(), "HOME": str(tmp_path)}
    # the exit code, each stream's first line (the usage's rest is not replayed); the digest-* cases
    # depend on the registry's content, the start-* ones on the user and /dev/fuse: test_container_enroot
    # replays them with those
    for case in [c for c in recorded if not c["id"].startswith(("digest-", "start-"))]:
        done = subprocess.run(case["argv"], capture_output=True, text=True, env=env, timeout=30)
        assert done.returncode == case["exit_code"], case["id"]
        for stream in ("stdout", "stderr"):
            assert done.__dict__[stream].splitlines()[:1] == case[stream].splitlines()[:1], (case["id"], stream)
    config = tmp_path / "tether.yaml"
    config.write_text(f"container: {{runtime: enroot, enroot: {{binary: {fake_runtimes.bin_dir}/enroot}}}}\n")
    doc = doctor_mod.Doctor(str(config))
    doc.config = load_config(str(config))
    findings = {f.name: f for f in doc.check_runtimes()}
    assert findings["runtime enroot"].status == doctor_mod.OK and "4.1.2" in findings["runtime enroot"].detail
    assert os.access(fake_runtimes.bin_dir / "enroot", os.X_OK)


def test_a_store_any_user_can_take_first_is_a_warning(tmp_path):
    """An earlier default (/var/tmp/tether-podman-{uid}) kept in a site's config keeps stores where
    any user can make another's first (issue 39, finding 5): the doctor says so; the default does
    not warn."""
    config = tmp_path / "tether.yaml"
    config.write_text("container: {podman: {store: \"/var/tmp/tether-podman-{uid}\"}}\n")
    doc = doctor_mod.Doctor(str(config))
    doc.config = load_config(str(config))
    [finding] = list(doc.check_stores())
    assert finding.status == doctor_mod.WARN and "/var/tmp is writable by every user" in finding.detail
    config.write_text("{}\n")
    doc.config = load_config(str(config))
    assert list(doc.check_stores()) == []

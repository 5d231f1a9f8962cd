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

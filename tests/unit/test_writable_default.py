"""container.writable (issue 45): pyxis's containers are writable or not as the site's enroot config
says (ENROOT_ROOTFS_WRITABLE); tether's follow the admin's container.writable, and a user's
--container-writable / --container-readonly win over it."""

from __future__ import annotations

import pytest

from helpers import make_config
from tether.container.rank_launcher import why_not_fast
from tether.container.runtimes import adapter
from tether.container.spec import LaunchError, spec_from_env
from tether.hooks.errors import ConfigError

JOB = {"TETHER_CONTAINER_IMAGE": "/images/app.sqsh", "SLURM_JOB_ID": "42"}


def _writable(default: bool | None, **flags: str) -> bool:
    env = {**JOB, **{f"TETHER_CONTAINER_{k.upper()}": v for k, v in flags.items()}}
    defaults = {} if default is None else {"writable": default}
    return spec_from_env(env, ["true"], default_runtime="enroot", defaults=defaults).writable


def test_the_admins_default_decides_unless_the_user_chose():
    assert (_writable(None), _writable(False), _writable(True)) == (None, False, True)   # None: the runtime's
    assert _writable(True, readonly="1") is False and _writable(False, writable="1") is True
    assert _writable(True, readonly="0") is True              # "not read-only" is no choice of read-only
    with pytest.raises(LaunchError, match=r"^--container-writable and --container-readonly ask for opposite things: "
                                          r"give one \(without either, the admin's default: container.writable\)$"):
        _writable(True, writable="1", readonly="1")


def test_enroot_is_told_both_ways_and_left_to_its_config_when_nobody_chose(tmp_path):
    """enroot's own ENROOT_ROOTFS_WRITABLE (enroot.conf, the user's environment) decides only when
    neither the user nor the admin did: a read-only choice is enforced, not just --rw left out."""
    image = tmp_path / "app.sqsh"
    image.write_bytes(b"hsqs")
    job = {**JOB, "TETHER_CONTAINER_IMAGE": str(image)}
    host = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "ENROOT_ROOTFS_WRITABLE": "yes"}
    for default, flags, rw, told in ((True, {}, True, "y"), (False, {}, False, "n"), (None, {}, False, "yes"),
                                     (True, {"TETHER_CONTAINER_READONLY": "1"}, False, "n")):
        spec = spec_from_env({**job, **flags}, ["true"], default_runtime="enroot", defaults={"writable": default})
        launch = adapter("enroot", {}).launch(spec, host)
        assert ("--rw" in launch.argv, launch.env.get("ENROOT_ROOTFS_WRITABLE")) == (rw, told), (default, flags)


def test_the_config_key_is_a_boolean_and_sends_ranks_past_the_c_launcher():
    assert make_config(container={"writable": True}).data["container"]["writable"] is True
    assert make_config().data["container"]["writable"] is None
    with pytest.raises(ConfigError, match="container.writable"):
        make_config(container={"writable": "yes"})
    # the C launcher applies no config defaults: a writable default is the Python launcher's
    assert why_not_fast({"runtime": "podman", "writable": True}) == "container.writable is set"
    assert why_not_fast({"runtime": "podman", "writable": False}) is None

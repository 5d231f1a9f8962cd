"""The leftover cleanup (tether.container.cleanup): markers are data, never commands.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from container_helpers import _as_user


# ---- the leftover cleanup: markers are data --------------------------------------------------------
def _cleanup_in(where: Path, settings: dict, uid: int = 1003):
    """run_leftovers as the user ``uid`` (as slurmstepd runs it), for the markers under ``where``."""
    from tether.container.cleanup import run_leftovers

    return _as_user(uid, lambda: run_leftovers(str(where), settings))


def test_cleanup_runs_only_tethers_own_removal_for_what_a_marker_names(public_dir):
    """Regression (issue 12): a planted marker made the cleanup run the commands it named."""
    step = public_dir / "step-0"
    step.mkdir()
    log = public_dir / "calls"
    fake = public_dir / "podman"
    fake.write_text(f"#!/bin/sh\necho \"podman $*\" >> {log}\n"
                    f"[ \"$1\" = inspect ] && echo {'ab' * 32}\n[ \"$1\" = container ] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    runc = public_dir / "runc"
    runc.write_text(f"#!/bin/sh\necho \"runc $*\" >> {log}\n")
    runc.chmod(0o755)
    xdg = public_dir / "xdg"
    (xdg / "runc" / ("ab" * 32)).mkdir(parents=True)             # the state podman 4.3 leaves
    pwned = public_dir / "pwned"
    markers = {
        # an earlier release's run directory field: never read (the adapter says where podman runs)
        ".cleanup-0": {"runtime": "podman", "container": "tether-7-0-0", "xdg_runtime_dir": str(public_dir)},
        ".cleanup-1": {"commands": [["touch", str(pwned)]], "env": {}},                # the old format
        ".cleanup-2": {"runtime": "podman", "container": "x; touch " + str(pwned)},
        ".cleanup-3": {"runtime": "/bin/sh", "container": "tether-7-0-3"},
        ".cleanup-4.999": {"runtime": "podman", "container": "tether-7-0-4"},           # half-written
    }
    for name, data in markers.items():
        (step / name).write_text(json.dumps(data))
    os.mkfifo(step / ".cleanup-5")
    for p in [public_dir, step, xdg, *step.iterdir()]:
        os.chown(p, 1003, 1003)
    settings = {"podman": {"binary": str(fake), "args": ["--runtime", str(runc)], "env": {"XDG_RUNTIME_DIR": str(xdg)},
                           "store": "/var/tmp/store-{uid}"}}
    signal.alarm(30)
    try:
        assert _cleanup_in(step, settings) == 0
    finally:
        signal.alarm(0)
    # the user's store (its run state in podman's run directory, the config's), as the launch used it
    store = f"--root /var/tmp/store-1003/storage --runroot {xdg}/tether-podman/storage"
    assert log.read_text().splitlines() == [
        f"podman inspect --runtime {runc} {store} --format {{{{.Id}}}} tether-7-0-0",
        f"podman rm --runtime {runc} {store} --force --ignore --volumes --time 0 tether-7-0-0",
        f"podman container exists --runtime {runc} {store} tether-7-0-0",
        f"runc --root {xdg}/runc delete --force {'ab' * 32}"]
    assert not pwned.exists()


def test_cleanup_removes_a_steps_pod_after_its_ranks_and_only_from_its_own_marker(public_dir):
    """A step's pod (--container-unshare) is removed by the step's cleanup when its ranks were
    killed before the last one left it: its own marker, ``.cleanup-pod``, after the ranks'. A
    rank's marker that says "pod" is still a container's; a pod's marker needs its name."""
    step = public_dir / "step-0"
    step.mkdir()
    log = public_dir / "calls"
    fake = public_dir / "podman"
    fake.write_text(f"#!/bin/sh\necho \"podman $*\" >> {log}\n[ \"$1\" = container ] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    (step / ".cleanup-pod").write_text(json.dumps({"runtime": "podman", "container": "tether-7-0-pod", "pod": "1"}))
    (step / ".cleanup-0").write_text(json.dumps({"runtime": "podman", "container": "tether-7-0-0", "pod": "1"}))
    for p in [public_dir, step, *step.iterdir()]:
        os.chown(p, 1003, 1003)
    settings = {"podman": {"binary": str(fake), "store": ""}}
    signal.alarm(30)
    try:
        assert _cleanup_in(step, settings) == 0
    finally:
        signal.alarm(0)
    calls = log.read_text().splitlines()
    assert calls[-1] == "podman pod rm --force --ignore tether-7-0-pod", calls
    assert [c for c in calls if "tether-7-0-0" in c][0].startswith("podman inspect"), calls   # a container
    assert calls.index("podman pod rm --force --ignore tether-7-0-pod") > max(
        i for i, c in enumerate(calls) if "tether-7-0-0" in c)

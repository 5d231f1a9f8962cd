"""Containers a step's end interrupted: the markers a supervised launch leaves, and the cleanup run.

A time limit or ``scancel`` signals every process of a step -- the launcher's own ``podman rm`` of
an abnormally ended container included. So while a supervised container runs, its launcher keeps a
marker in the step's directory (``.cleanup-<rank>``, tether.hooks.layout; written by
tether.container.launch.write_marker) naming the runtime and the container; the marker goes once
nothing is left to do. When a step (or, at the job's end, the batch
step) finds markers, slurmstepd (or tether-jobdirs, on PBS) runs the launcher once more as the job
user in cleanup mode (``TETHER_CLEANUP=<dir>``), outside the step, in a session a watcher kills
after a bound (native/jobdirs.c).

A marker is data, never a command: the directory is the user's, so anything in it may be planted.
Cleanup runs only the removal tether's own config spells for a runtime it knows, for a container
named as tether names them, with a fixed PATH -- nothing a marker says is executed.
"""

from __future__ import annotations

import json
import os
import stat

from ..hooks.layout import CLEANUP_MARKER, POD_MARKER, RANK_PREFIX
from ..hooks.surface import CLEANUP_FD_VAR, RUNTIMES
from .launch import report_admin
from .runtimes import adapter
from .spec import LaunchError

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

if TYPE_CHECKING:
    from typing import Any, Mapping

MARKER_LIMIT = 4096
CLEANUP_PATH = "/usr/local/bin:/usr/bin:/bin"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _is_container_name(name: object) -> bool:
    return (isinstance(name, str) and name.startswith("tether-") and len(name) <= 200
            and all(c in _NAME_CHARS for c in name))


def read_marker(path: str) -> dict[str, str] | None:
    """What a marker asks to remove -- ``{"runtime", "container"}``, and ``"pod"`` for a step's
    pod (its own marker, ``.cleanup-pod``) -- or None
    (and a line for the admin) when it is not a marker tether could have written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        report_admin(f"cleanup: ignoring {path}: {exc.strerror}")
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        try:
            data = json.loads(fh.read(MARKER_LIMIT + 1)) if stat.S_ISREG(st.st_mode) else None
        except ValueError:
            data = None
    if not (isinstance(data, dict) and data.get("runtime") in RUNTIMES and _is_container_name(data.get("container"))
            and st.st_uid == os.getuid() and st.st_size <= MARKER_LIMIT):
        report_admin(f"cleanup: ignoring {path}: not a marker tether wrote")
        return None
    # an "xdg_runtime_dir" of an earlier release is not read: the runtime's run directory is the
    # adapter's to say (Podman.run_dir), never a file's. "pod": a step's pod (--container-unshare)
    # "mount": a rank's cluster store image mount, taken away only where such mounts are made
    # (podman's run directory of this user: Podman.unmount_leftover checks)
    mount = data.get("mount")
    return {"runtime": data["runtime"], "container": data["container"],
            **({"pod": "1"} if data.get("pod") == "1" and os.path.basename(path) == POD_MARKER else {}),
            **({"mount": mount} if isinstance(mount, str) else {})}


def find_markers(where: str) -> list[str]:
    """Markers in a step's directory, or in a job's (<node>/step-*/ below it, at the job's end)."""
    found = []
    for top, dirs, files in os.walk(where):
        found += [os.path.join(top, f) for f in files          # .cleanup-<rank>, not a half-written one
                  if f.startswith(CLEANUP_MARKER) and f[len(CLEANUP_MARKER):].isascii()
                  and f[len(CLEANUP_MARKER):].isdigit()]
        found += [os.path.join(top, f) for f in files if f == POD_MARKER]      # after its step's ranks
        depth = top[len(where):].count(os.sep)
        dirs[:] = [d for d in dirs if depth < 2 and not d.startswith(RANK_PREFIX)]
    return found


def run_leftovers(where: str, settings: Mapping[str, Any]) -> int:
    """Cleanup mode (see the module docstring): read the markers under ``where``, tell the daemon
    (closing fd 3), then remove each container the way its runtime adapter does, with tether's
    config. 0 when all done; failures go to the system log (nobody reads this output)."""
    todo = [m for m in (read_marker(p) for p in find_markers(where)) if m]
    if os.environ.get(CLEANUP_FD_VAR) == "3":
        try:
            os.close(3)                      # markers read: the daemon may remove the directory
        except OSError:
            pass
    failed = 0
    for marker in todo:
        try:
            runtime = adapter(marker["runtime"], settings.get(marker["runtime"]) or {})
        except LaunchError as exc:
            report_admin(f"cleanup: {exc}")
            failed += 1
            continue
        env = runtime.base_env({"PATH": CLEANUP_PATH, "HOME": os.environ.get("HOME", "/"),
                                "USER": os.environ.get("USER", "")})
        # in this session: the watcher's kill reaches the removal too when it overruns
        if marker.get("pod"):
            removed = hasattr(runtime, "remove_pod") and runtime.remove_pod(marker["container"], env,
                                                                             new_session=False)
        else:
            removed = runtime.remove(marker["container"], env, new_session=False)
        if marker.get("mount") and hasattr(runtime, "unmount_leftover"):
            removed = runtime.unmount_leftover(marker["mount"], env) and removed
        if not removed:
            failed += 1
    return 1 if failed else 0

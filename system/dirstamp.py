"""Whether a directory's entries changed while a program ran, from its timestamps alone.

The container launcher gives podman ``--cidfile <rank dir>/.cid`` and must tell "podman failed
before it created the container" (safe to try once more) from "the container ran" -- also under
podman 5, which removes the file again when ``--rm`` removes the container, so the file's existence
says nothing there. A created container always made the file, which changed the rank directory's
mtime/ctime (and its removal changes them again). Nothing else of tether's writes entries into the
rank directory while podman runs; a user's own entry there only makes the answer "changed" (no
retry: the safe side).

Timestamps, not inotify: on this machine's kernel an inotify instance costs 5-13 ms when it is
closed (fsnotify_destroy_group waits for an SRCU grace period), which every containerized rank
paid at its exit. A filesystem whose timestamps are whole seconds (nanoseconds 0) could hide a
create-and-remove inside one second: there the answer is "unknown" (no retry).
"""

from __future__ import annotations

import os


class DirStamp:
    """The stamp of ``path`` (a directory) now; ``changed()`` compares it with the directory later:
    True (an entry was made, renamed or removed), False (nothing), None (cannot be told)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp: tuple[int, int, int] | None = None
        try:
            st = os.stat(path)
        except OSError:
            return
        if st.st_mtime_ns % 1_000_000_000 or st.st_ctime_ns % 1_000_000_000:   # sub-second times
            self.stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def changed(self) -> bool | None:
        if self.stamp is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return True                      # the directory itself went away
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != self.stamp

"""Whether a file was written while a program ran, even if the program removed it again (inotify).

The container launcher gives podman ``--cidfile`` and reads the file's existence afterwards to tell
"podman failed before it created the container" (safe to try once more) from "the container ran".
podman 5 removes the file again when ``--rm`` removes the container, so existence alone says
nothing there: a container whose command exited 1 looked never created, and its command ran twice.
What a created container always leaves is the write of its id into the file; this watch sees it.
"""

from __future__ import annotations

import os
import struct

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")        # struct inotify_event: wd, mask, cookie, len; then the name


class WriteWatch:
    """Watch ``path``'s directory for a write to (or a rename onto) ``path``'s name. ``written()``
    is True, False, or None when inotify could not be used (then nothing can be said)."""

    def __init__(self, path: str) -> None:
        self.fd: int | None = None
        self.name = os.fsencode(os.path.basename(path))
        self.seen = False
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            if libc.inotify_add_watch(fd, os.fsencode(os.path.dirname(path) or "."), IN_MODIFY | IN_MOVED_TO) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError, ImportError):
            self.fd = None

    def written(self) -> bool | None:
        """Was ``path`` written since the watch began (events read so far and now)?"""
        if self.fd is None:
            return None
        overflow = False
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:            # an overflowed or broken queue: nothing certain
                return None
            if not buf:
                break
            offset = 0
            while offset + _EVENT.size <= len(buf):
                _, mask, _, length = _EVENT.unpack_from(buf, offset)
                overflow = overflow or bool(mask & IN_Q_OVERFLOW)
                name = buf[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if name == self.name:
                    self.seen = True
        return True if self.seen else (None if overflow else False)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

"""The Apptainer/Singularity image cache: a docker:// (or other remote) source converted to SIF once.

Layout under ``container.apptainer_image_root`` (shared by all nodes)::

    <root>/<key>.sif, <key>.json             converted by root (an admin's `tether images pull`):
                                              used by every user
    <root>/users/<uid>/<key>.sif, .json       converted by that user on first use: used by that user
    <root>/users/                             root-owned, mode 1777 (like /tmp)

Users never use an image another user converted (a user could otherwise plant a poisoned image
under a popular source's key). ``<key>`` is derived from the source string. Concurrent first uses
from many ranks and nodes convert exactly once: the converter holds an exclusive ``flock`` on
``<key>.lock``, builds into a hidden partial file in the same directory, and renames it into place
only when the build succeeded -- a failed or killed conversion never becomes visible, and its
partial file is removed by the next converter (which holds the lock) or by ``prune``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from .launch import remove_file
from .spec import LaunchError

PARTIAL = ".partial"


def image_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CachedImage:
    path: str
    source: str
    owner: int
    size: int
    last_used: float


class ImageCache:
    """One image cache root (see the module docstring)."""

    def __init__(self, root: str, uid: int | None = None):
        self.root = root
        self.uid = os.getuid() if uid is None else uid

    # --- where entries live ---
    def shared_dir(self) -> str:
        return self.root

    def user_dir(self, create: bool = False) -> str:
        """This user's directory (root's is the shared one); created 0700 on demand, never followed
        through a symlink, refused when someone else owns it."""
        if self.uid == 0:
            return self.root
        users = os.path.join(self.root, "users")
        path = os.path.join(users, str(self.uid))
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise LaunchError(f"image cache: cannot create {path}: {exc.strerror} (an admin must "
                                  f"create {users} owned by root with mode 1777)") from None
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return path
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != self.uid:
            raise LaunchError(f"image cache: {path} is not a directory owned by uid {self.uid}; refusing "
                              f"to use it (ask an admin to remove it)")
        return path

    def _trusted(self, path: str, owner: int) -> bool:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_uid == owner and not st.st_mode & 0o022

    def lookup(self, source: str) -> str | None:
        """The converted image for ``source`` this user may use, or None."""
        key = image_key(source)
        shared = os.path.join(self.root, key + ".sif")
        if self._trusted(shared, 0):
            return shared
        if self.uid != 0:
            mine = os.path.join(self.user_dir(), key + ".sif")
            if self._trusted(mine, self.uid):
                return mine
        return None

    def ensure(self, source: str, *, build: Sequence[str], env: Mapping[str, str] | None = None,
               timeout: float = 3600.0) -> str:
        """The SIF for ``source``, converting it with ``build + [partial, source]`` if needed."""
        found = self.lookup(source)
        if found:
            _touch(found)
            return found
        directory = self.user_dir(create=True)
        if not os.path.isdir(directory):
            raise LaunchError(f"image cache: {directory} does not exist (an admin creates "
                              f"apptainer_image_root with `tether slurm install --write`)")
        key = image_key(source)
        final = os.path.join(directory, key + ".sif")
        lock_fd = os.open(os.path.join(directory, key + ".lock"),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            if self._trusted(final, self.uid):        # another rank converted it meanwhile
                _touch(final)
                return final
            self._remove_partials(directory, key)
            partial = os.path.join(directory, f".{key}.{os.getpid()}{PARTIAL}")
            from ..system.proc import CommandError, run_command

            try:
                run_command([*build, partial, source], env=env, timeout=timeout)
            except CommandError as exc:
                remove_file(partial)
                raise LaunchError(f"cannot convert {source} into a SIF image: {exc}") from None
            except BaseException:
                remove_file(partial)
                raise
            os.chmod(partial, 0o644)
            from ..system.files import write_atomic

            meta = {"source": source, "converted": time.time(), "uid": self.uid}
            write_atomic(os.path.join(directory, key + ".json"), json.dumps(meta) + "\n", 0o644)
            os.rename(partial, final)
            return final
        finally:
            os.close(lock_fd)

    @staticmethod
    def _remove_partials(directory: str, key: str) -> None:
        for entry in os.listdir(directory):
            if entry.startswith(f".{key}.") and entry.endswith(PARTIAL):
                remove_file(os.path.join(directory, entry))

    # --- tether images ls | prune ---
    def entries(self) -> Iterator[CachedImage]:
        """The images this user can see: the shared ones, and their own (root: everyone's)."""
        dirs = [self.root]
        users = os.path.join(self.root, "users")
        if self.uid == 0 and os.path.isdir(users):
            dirs += [os.path.join(users, d) for d in sorted(os.listdir(users))]
        elif self.uid != 0:
            dirs.append(self.user_dir())
        for directory in dirs:
            if not os.path.isdir(directory):
                continue
            for entry in sorted(os.listdir(directory)):
                if not entry.endswith(".sif") or entry.startswith("."):
                    continue
                path = os.path.join(directory, entry)
                st = os.lstat(path)
                try:
                    with open(path[:-4] + ".json") as fh:
                        source = json.load(fh).get("source", "?")
                except (OSError, ValueError):
                    source = "?"
                yield CachedImage(path, source, st.st_uid, st.st_size, st.st_mtime)

    def prune(self, older_than_days: float, *, now: float | None = None) -> list[str]:
        """Remove images not used for ``older_than_days`` (and stale partial files this user owns,
        when no conversion holds their lock); returns the removed paths."""
        now = time.time() if now is None else now
        removed = []
        for image in list(self.entries()):
            if image.owner != self.uid and self.uid != 0:
                continue
            if now - image.last_used >= older_than_days * 86400:
                for suffix in (".sif", ".json", ".lock"):
                    remove_file(image.path[:-4] + suffix)
                removed.append(image.path)
        for directory in {os.path.dirname(i.path) for i in self.entries()} | {self.user_dir()}:
            if os.path.isdir(directory):
                removed += self._prune_partials(directory)
        return removed

    def _prune_partials(self, directory: str) -> list[str]:
        removed = []
        for entry in os.listdir(directory):
            if not (entry.startswith(".") and entry.endswith(PARTIAL)):
                continue
            key = entry[1:].split(".", 1)[0]
            lock = os.path.join(directory, key + ".lock")
            try:
                fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                fd = None
            try:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                remove_file(os.path.join(directory, entry))
                removed.append(os.path.join(directory, entry))
            except BlockingIOError:
                pass                              # a conversion is running: its file is not stale
            finally:
                if fd is not None:
                    os.close(fd)
        return removed


def _touch(path: str) -> None:
    """Record a use (the mtime is the last use; prune goes by it)."""
    try:
        os.utime(path)
    except OSError:
        pass                                      # a shared image this user cannot touch

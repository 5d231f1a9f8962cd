"""The Apptainer/Singularity image cache: a docker:// (or other remote) source converted to SIF once.

Two places, each written by exactly one owner, so nobody ever uses -- and root never walks -- files
another user controls::

    <apptainer_image_root>/<key>.sif, .json   the shared cache: converted by root (an admin's
                                                `tether images pull`), root-owned, read by everyone
    <user_image_cache>/<key>.sif, .json        a user's own conversions (default
                                                ~/.cache/tether/images): written and used by that user

Users never use an image another user converted (a user could otherwise plant a poisoned image
under a popular source's key), and root's ``tether images ls|prune`` touch only the shared cache.
``<key>`` is derived from the source string. Concurrent first uses from many ranks and nodes convert
exactly once: the converter holds an exclusive ``flock`` on ``<key>.lock``, builds into a hidden
partial file in the same directory, and renames it into place only when the build succeeded -- a
failed or killed conversion never becomes visible, and its partial file is removed by the next
converter (which holds the lock) or by ``prune``.

Every file is opened without following symlinks and without blocking (a FIFO named like an image
or its metadata is skipped, never read), and only regular files of the expected owner count.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import stat
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from ..system.files import write_atomic
from ..system.proc import CommandError, run_command
from .launch import progress, remove_file
from .spec import LaunchError

PARTIAL = ".partial"
META_LIMIT = 64 * 1024
DEFAULT_USER_CACHE = "{home}/.cache/tether/images"


def image_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def _home(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def user_cache_dir(template: str, uid: int, home: str | None) -> str:
    """The user's own cache directory from the config's template (``{home}``, ``{uid}``)."""
    if "{home}" in template and not (home and home.startswith("/")):
        raise LaunchError(f"image cache: uid {uid} has no home directory for container.user_image_cache "
                          f"({template}); an admin sets one without {{home}}")
    return template.format(home=(home or "").rstrip("/"), uid=uid)


@dataclass(frozen=True)
class CachedImage:
    path: str
    source: str
    owner: int
    size: int
    last_used: float


def _regular(path: str, owner: int) -> os.stat_result | None:
    """lstat of ``path`` when it is a regular file of ``owner`` that nobody else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
        return None
    return st


def read_metadata(path: str) -> dict:
    """An image's metadata file (``{}`` when it is absent, not a regular file, too big or not JSON)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return {}
        try:
            data = json.loads(fh.read(META_LIMIT + 1)[:META_LIMIT])
        except ValueError:
            return {}
    return data if isinstance(data, dict) else {}


class ImageCache:
    """The shared cache at ``root`` and, for a user, their own at ``user_dir`` (module docstring)."""

    def __init__(self, root: str, uid: int | None = None, user_dir: str | None = None):
        self.root = root
        self.uid = os.getuid() if uid is None else uid
        if user_dir is None:
            user_dir = user_cache_dir(DEFAULT_USER_CACHE, self.uid, _home(self.uid))
        self.user_dir = None if self.uid == 0 else user_dir

    @property
    def own_dir(self) -> str:
        """Where this user's conversions go: the shared cache for root, else their own."""
        return self.root if self.user_dir is None else self.user_dir

    def _checked_own_dir(self, create: bool) -> str:
        """The own directory, created 0700 on demand; refused unless it is a directory of this user."""
        path = self.own_dir
        if create and self.user_dir is not None:
            os.makedirs(path, mode=0o700, exist_ok=True)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise LaunchError(f"image cache: {path} does not exist (an admin creates apptainer_image_root "
                              f"with `tether slurm install --write`)") from None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != self.uid:
            raise LaunchError(f"image cache: {path} is not a directory of uid {self.uid}; refusing to use it")
        return path

    def lookup(self, source: str) -> str | None:
        """The converted image for ``source`` this user may use, or None."""
        key = image_key(source)
        shared = os.path.join(self.root, key + ".sif")
        if _regular(shared, 0):
            return shared
        if self.user_dir is not None:
            mine = os.path.join(self.user_dir, key + ".sif")
            if _regular(mine, self.uid):
                return mine
        return None

    def ensure(self, source: str, *, build: Sequence[str], env: Mapping[str, str] | None = None,
               timeout: float = 3600.0) -> str:
        """The SIF for ``source``, converting it with ``build + [partial, source]`` if needed."""
        found = self.lookup(source)
        if found:
            _touch(found)
            return found
        directory = self._checked_own_dir(create=True)
        key = image_key(source)
        final = os.path.join(directory, key + ".sif")
        lock_fd = os.open(os.path.join(directory, key + ".lock"),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:                   # another rank of this user converts it now
                progress(f"waiting for another rank's conversion of {source} into a SIF image")
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            if _regular(final, self.uid):             # another rank converted it meanwhile
                _touch(final)
                return final
            self._remove_partials(directory, key)
            partial = os.path.join(directory, f".{key}.{os.getpid()}{PARTIAL}")
            started = time.monotonic()
            progress(f"converting {source} into a SIF image ({os.path.basename(build[0])}) ...")
            try:
                run_command([*build, partial, source], env=env, timeout=timeout)
            except CommandError as exc:
                remove_file(partial)
                raise LaunchError(f"cannot convert {source} into a SIF image: {exc}") from None
            except BaseException:
                remove_file(partial)
                raise
            os.chmod(partial, 0o644)
            meta = {"source": source, "converted": time.time(), "uid": self.uid}
            write_atomic(os.path.join(directory, key + ".json"), json.dumps(meta) + "\n", 0o644)
            os.rename(partial, final)
            progress(f"converted {source}: {os.path.getsize(final) / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
            return final
        finally:
            os.close(lock_fd)

    @staticmethod
    def _remove_partials(directory: str, key: str) -> None:
        for entry in os.listdir(directory):
            if entry.startswith(f".{key}.") and entry.endswith(PARTIAL):
                remove_file(os.path.join(directory, entry))

    # --- tether images ls | prune ---
    def _dirs(self) -> list[tuple[str, int]]:
        """(directory, the owner its images must have) this user lists: the shared cache, and their own."""
        dirs = [(self.root, 0)]
        if self.user_dir is not None:
            dirs.append((self.user_dir, self.uid))
        return dirs

    def entries(self) -> Iterator[CachedImage]:
        """The images this user can see: the shared ones, and their own (root: the shared ones)."""
        for directory, owner in self._dirs():
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for entry in names:
                if not entry.endswith(".sif") or entry.startswith("."):
                    continue
                path = os.path.join(directory, entry)
                st = _regular(path, owner)
                if st is None:
                    continue
                source = str(read_metadata(path[:-4] + ".json").get("source", "?"))
                yield CachedImage(path, source, st.st_uid, st.st_size, st.st_mtime)

    def prune(self, older_than_days: float, *, now: float | None = None) -> list[str]:
        """Remove this user's own images (root: the shared cache's) not used for ``older_than_days``,
        and stale partial files when no conversion holds their lock; returns the removed paths."""
        if older_than_days < 0 or older_than_days != older_than_days:   # negative or NaN
            raise LaunchError(f"--older-than {older_than_days:g}: give a number of days >= 0")
        now = time.time() if now is None else now
        removed = []
        mine = self.own_dir
        for image in list(self.entries()):
            if os.path.dirname(image.path) != mine or now - image.last_used < older_than_days * 86400:
                continue
            for suffix in (".sif", ".json", ".lock"):
                remove_file(image.path[:-4] + suffix)
            removed.append(image.path)
        if os.path.isdir(mine) and not os.path.islink(mine):
            removed += self._prune_partials(mine)
        return removed

    def _prune_partials(self, directory: str) -> list[str]:
        removed = []
        for entry in os.listdir(directory):
            if not (entry.startswith(".") and entry.endswith(PARTIAL)):
                continue
            key = entry[1:].split(".", 1)[0]
            try:
                fd = os.open(os.path.join(directory, key + ".lock"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
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

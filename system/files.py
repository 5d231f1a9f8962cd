"""Files written whole or not at all, directories with exact modes, and other programs' config lines;
directories and files a user's process may trust.

Used where tether writes as an admin (plugins, launchers, hook configs, slurm.conf and
plugstack.conf lines), where a rank writes metadata (the image cache), and where a user's process
keeps state in a place another user might have prepared first (the pilot directory).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import re
import stat
import tempfile
from pathlib import Path


def write_atomic(dest: Path | str, data: bytes | str, mode: int, *, durable: bool = False) -> None:
    """Write ``dest`` whole or not at all: a temporary file beside it, then a rename (a new inode, so
    a process that has the old file loaded or open keeps it). ``durable``: on the disk before the
    rename (what other hosts read from a shared filesystem)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_file(src: Path, dest: Path) -> None:
    """Install ``src`` as ``dest`` with mode 755 and a new inode (never overwrite a loaded .so)."""
    write_atomic(dest, Path(src).read_bytes(), 0o755)


def create_dir(path: Path, mode: int) -> bool:
    """Create ``path`` (and its parents) with exactly ``mode``, whatever the umask; False if it
    existed already."""
    if path.exists():
        return False
    path.mkdir(mode=mode, parents=True)
    os.chmod(path, mode)
    return True


def world_readable(path: Path) -> bool:
    """True if other users can read ``path`` and traverse every directory above it."""
    path = Path(path).resolve()
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
    if mode & need != need:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


def set_conf_line(path: Path, pattern: str, line: str | None) -> None:
    """Replace the line matching ``pattern`` (at line start, case-insensitive) or append ``line``;
    the file is rewritten atomically and keeps its mode. ``line=None`` removes matching lines."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        text, mode = "", 0o644
    lines = text.splitlines()
    rx = re.compile(r"\s*" + pattern, re.I)
    hits = [i for i, existing in enumerate(lines) if rx.match(existing)]
    for i in reversed(hits[1:] if line is not None else hits):
        del lines[i]
    if line is not None:
        if hits:
            lines[hits[0]] = line
        else:
            lines.append(line)
    write_atomic(path, "\n".join(lines) + "\n", mode)


class UntrustedPath(Exception):
    """A path another user could change (or has prepared): ``str()`` names it and says why."""


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _private(path: str, st: os.stat_result, uid: int, what: str, kind: str) -> None:
    """Refuse ``path`` unless it is a ``kind`` ("directory", "regular file") of ``uid`` that
    nobody else can write."""
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPath(f"{what} {path}: it is a symlink")
    if not (stat.S_ISDIR if kind == "directory" else stat.S_ISREG)(st.st_mode):
        raise UntrustedPath(f"{what} {path}: it is not a {kind}")
    if st.st_uid != uid:
        raise UntrustedPath(f"{what} {path}: it belongs to {_owner(st.st_uid)}, not to you (uid {uid})")
    if st.st_mode & 0o022:
        raise UntrustedPath(f"{what} {path}: others can write to it (mode {stat.S_IMODE(st.st_mode):04o})")


def _lstat_or_make(path: str, create: bool, mode: int) -> os.stat_result:
    """``lstat(path)``; with ``create``, a missing directory is made first (``mode`` whatever the
    umask; one made meanwhile by someone else is taken as it is: the caller checks it)."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    else:
        os.chmod(path, mode)
    return os.lstat(path)


def trusted_directory(path: str | os.PathLike, uid: int, what: str, *, create: bool = False,
                      mode: int = 0o700) -> Path:
    """``path`` as a directory only ``uid`` can change: a real directory of ``uid``, not writable
    by group or others, and every directory above it root's or ``uid``'s and not writable by
    others unless sticky (as /tmp) -- as OpenSSH's StrictModes checks a path: whoever can rename
    entries in a parent can swap the directory for one of their own at any time. ``create``:
    make what is missing (``mode``, whatever the umask). Symlinks above it are followed and
    what they lead to is checked; the directory itself must not be one. Returns the path with
    those symlinks resolved (use it from then on). UntrustedPath when it is not so, OSError
    (FileNotFoundError without ``create``) when it cannot be reached."""
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    if not name:
        raise UntrustedPath(f"{what} {path}: it is not a directory of yours")
    parent = os.path.realpath(parent)
    here = "/"
    for part in [p for p in parent.split("/") if p] + [None]:
        st = _lstat_or_make(here, create, mode)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UntrustedPath(f"{what} {path}: its parent {here} is not a directory")
        if st.st_uid not in (0, uid):
            raise UntrustedPath(f"{what} {path}: its parent {here} belongs to {_owner(st.st_uid)}, who could "
                                f"replace what is below it")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UntrustedPath(f"{what} {path}: its parent {here} can be written by others (mode "
                                f"{stat.S_IMODE(st.st_mode):04o}, not sticky), who could replace what is below it")
        if part is None:
            break
        here = os.path.join(here, part)
    target = os.path.join(parent, name)
    st = _lstat_or_make(target, create, mode)
    _private(target if target == path else f"{path} ({target})", st, uid, what, "directory")
    return Path(target)


def open_trusted_file(path: str | os.PathLike, flags: int, uid: int, what: str, mode: int = 0o600) -> int:
    """An fd of ``path``, opened ``flags`` without following a symlink or waiting on a FIFO, once
    it is a regular file of ``uid`` that nobody else can write (UntrustedPath otherwise; OSError
    when it cannot be opened). For files in a directory ``trusted_directory`` checked: what
    is there is then the user's own doing, and still read as data."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPath(f"{what} {path}: it is a symlink") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):   # a FIFO without a reader; a directory
            raise UntrustedPath(f"{what} {path}: it is not a regular file") from None
        raise
    try:
        _private(os.fspath(path), os.fstat(fd), uid, what, "regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd

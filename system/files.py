"""Files written whole or not at all, directories with exact modes, and other programs' config lines.

Used where tether writes as an admin (plugins, launchers, hook configs, slurm.conf and
plugstack.conf lines) and where a rank writes metadata (the image cache).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path


def write_atomic(dest: Path | str, data: bytes | str, mode: int) -> None:
    """Write ``dest`` whole or not at all: a temporary file beside it, then a rename (a new inode, so
    a process that has the old file loaded or open keeps it)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
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

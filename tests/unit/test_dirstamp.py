"""system.dirstamp.DirStamp: what the launcher uses to know podman created the container (it made
the id file in the rank's directory), also when podman 5 removed the file again with the container."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from tether.system import dirstamp
from tether.system.dirstamp import DirStamp


def test_a_file_made_and_removed_is_seen(tmp_path):
    stamp = DirStamp(str(tmp_path))
    assert stamp.changed() is False
    time.sleep(0.02)                           # podman takes longer than this to get there
    (tmp_path / ".cid").write_text("0123abcd")  # podman: the container's id, once created
    (tmp_path / ".cid").unlink()               # podman 5 with --rm: removed with the container
    assert stamp.changed() is True


def test_nothing_made_is_unchanged_and_reading_is_not_a_change(tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "deeper").write_text("a rank's own file, one level down")
    stamp = DirStamp(str(tmp_path))
    time.sleep(0.02)
    (tmp_path / "tmp" / "deeper").write_text("written again")
    os.listdir(tmp_path)
    assert stamp.changed() is False


def test_whole_second_timestamps_or_no_directory_say_nothing(tmp_path, monkeypatch):
    assert DirStamp(str(tmp_path / "nowhere")).changed() is None
    real = os.stat
    coarse = lambda path: SimpleNamespace(st_ino=real(path).st_ino, st_mtime_ns=1_700_000_000_000_000_000,
                                          st_ctime_ns=1_700_000_001_000_000_000)
    monkeypatch.setattr(dirstamp.os, "stat", coarse)
    assert DirStamp(str(tmp_path)).changed() is None

"""system.inotify.WriteWatch: what the launcher uses to know podman created the container (it wrote
the id file), also when podman 5 removed the file again with the container."""

from __future__ import annotations

import os

from tether.system.inotify import WriteWatch


def test_a_write_is_seen_even_after_the_file_is_gone(tmp_path):
    path = tmp_path / "cid"
    watch = WriteWatch(str(path))
    try:
        assert watch.written() is False
        path.write_text("0123abcd")            # podman: the container's id, once created
        path.unlink()                          # podman 5 with --rm: removed with the container
        assert watch.written() is True
    finally:
        watch.close()


def test_a_file_made_and_removed_unwritten_or_another_name_is_not(tmp_path):
    path = tmp_path / "cid"
    watch = WriteWatch(str(path))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # opened early, then a failed create
        os.close(fd)
        path.unlink()
        (tmp_path / "cid-other").write_text("x")
        assert watch.written() is False
    finally:
        watch.close()


def test_a_rename_onto_the_name_counts_and_no_inotify_says_nothing(tmp_path):
    path = tmp_path / "cid"
    watch = WriteWatch(str(path))
    try:
        (tmp_path / ".cid.tmp").write_text("0123")
        os.replace(tmp_path / ".cid.tmp", path)
        assert watch.written() is True
    finally:
        watch.close()
    blind = WriteWatch(str(tmp_path / "nowhere" / "cid"))     # its directory does not exist
    assert blind.written() is None

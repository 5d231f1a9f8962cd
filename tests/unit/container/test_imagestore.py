"""The cluster image store (container/imagestore.py): what a rank may trust in it, how an image gets
in whole or not at all, one publisher per reference, and what the admin's gc keeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tether.container import imagestore
from tether.container.imagestore import (ImageStore, PublishLock, StoreError, reference_key, squashfs_intact,
                                         wait_published)

OTHER = 65534           # nobody: a user who is not the store's account
REF = "registry.example:5000/tether/busybox:1"


def make_squashfs(tmp_path, name: str, content: str = "x") -> str:
    tree = tmp_path / f"tree-{name}"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hostname").write_text(content)
    out = tmp_path / f"{name}.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(out), "-quiet", "-noappend", "-no-progress"], check=True,
                   capture_output=True)
    return str(out)


def image_id(n: int) -> str:
    return f"{n:064x}"


@pytest.fixture
def store(tmp_path):
    s = ImageStore(str(tmp_path / "store"), os.getuid())
    s.setup()
    return s


def staged(store, tmp_path, name: str, content: str = "x") -> str:
    path = store.staging_path(name)
    os.rename(make_squashfs(tmp_path, name, content), path)
    return path


def test_a_published_reference_is_found_whole_and_as_fresh_as_asked(store, tmp_path):
    assert store.lookup(REF, max_age=None) is None
    got = store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    found = store.lookup(REF, max_age=60)
    assert found == got and found.path.endswith(f"/images/{image_id(1)}.sqfs")
    assert os.stat(found.path).st_mode & 0o777 == 0o444
    assert store.lookup("other:1", max_age=None) is None
    assert store.lookup(REF, max_age=-1) is None                   # resolved too long ago: ask again
    assert not os.listdir(os.path.join(store.root, "staging"))     # moved, not copied


def test_the_same_content_under_a_second_reference_is_kept_once(store, tmp_path):
    store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    store.publish("other:1", "sha256:" + "f" * 64, image_id(1), staged(store, tmp_path, "b"), user=1001)
    [info] = store.images()
    assert info.references == (REF, "other:1")
    assert store.lookup("other:1", max_age=None).path == store.lookup(REF, max_age=None).path
    assert not os.listdir(os.path.join(store.root, "staging"))


@pytest.mark.parametrize("planted", ["reference", "image", "symlink", "directory"])
def test_nothing_another_user_put_in_the_store_is_used(store, tmp_path, planted):
    store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    ref_file = os.path.join(store.root, "refs", f"{reference_key(REF)}.json")
    image = os.path.join(store.root, "images", f"{image_id(1)}.sqfs")
    if planted == "reference":
        os.chown(ref_file, OTHER, OTHER)
    elif planted == "image":
        os.chown(image, OTHER, OTHER)
    elif planted == "symlink":
        evil = make_squashfs(tmp_path, "evil", "evil")
        os.unlink(image)
        os.symlink(evil, image)
    else:
        os.chown(os.path.join(store.root, "images"), OTHER, OTHER)
    with pytest.raises(StoreError, match="cannot be trusted"):
        store.lookup(REF, max_age=None)


def test_a_store_writable_by_others_is_not_trusted(store):
    os.chmod(os.path.join(store.root, "refs"), 0o777)
    with pytest.raises(StoreError, match="can be written by others|others can write"):
        store.lookup(REF, max_age=None)


def test_a_truncated_image_is_said_not_started_and_none_is_published(store, tmp_path):
    store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    image = os.path.join(store.root, "images", f"{image_id(1)}.sqfs")
    os.chmod(image, 0o644)
    with open(image, "ab") as f:                  # grown (overwritten in place): not what was published
        f.write(b"\0" * 4096)
    with pytest.raises(StoreError, match=r"bytes, not the .*tether images rm"):
        store.lookup(REF, max_age=None)
    with open(image, "rb") as f:
        used = int.from_bytes(f.read(48)[40:48], "little")
    os.truncate(image, used - 1)
    with pytest.raises(StoreError, match=r"truncated .*tether images rm"):
        store.lookup(REF, max_age=None)
    partial = store.staging_path("bad")
    with open(partial, "wb") as f:
        f.write(b"not a squashfs" * 10)
    with pytest.raises(StoreError, match="not a squashfs image"):
        store.publish("other:1", "sha256:" + "f" * 64, image_id(2), partial, user=1000)
    assert store.lookup("other:1", max_age=None) is None


def test_the_superblock_check_reads_sizes_not_names(tmp_path):
    good = make_squashfs(tmp_path, "g")
    fd = os.open(good, os.O_RDONLY)
    try:
        assert squashfs_intact(fd) is None
    finally:
        os.close(fd)


def test_one_publisher_per_reference_and_a_dead_ones_lock_is_taken_over(store, monkeypatch):
    monkeypatch.setattr(imagestore, "HEARTBEAT", 0.05)
    first, second = store.lock(REF), store.lock(REF)
    assert first.try_acquire()
    try:
        assert not second.try_acquire()
        assert store.publisher(REF).endswith(f"pid {os.getpid()}")
        old = time.time() - imagestore.STALE_AFTER - 5
        os.utime(first.path, (old, old))
        time.sleep(0.3)                                       # the holder's heartbeat makes it fresh again
        assert not second.try_acquire()
    finally:
        first.release()
    assert store.publisher(REF) is None
    # a publisher killed while it held the lock: nobody touches it any more
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from tether.container.imagestore import ImageStore
        lock = ImageStore({store.root!r}, {os.getuid()}).lock({REF!r})
        assert lock.try_acquire()
        open(ImageStore({store.root!r}, {os.getuid()}).staging_path("dying"), "wb").write(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
        """)], capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not second.try_acquire()                           # fresh still: maybe only slow
    old = time.time() - imagestore.STALE_AFTER - 5
    os.utime(second.path, (old, old))
    assert store.publisher(REF) is None                       # ranks no longer wait for it
    assert second.try_acquire()
    second.release()
    assert store.lookup(REF, max_age=None) is None            # nothing half-published
    [left] = os.listdir(os.path.join(store.root, "staging"))
    os.utime(os.path.join(store.root, "staging", left), (old, old))
    store.gc(max_bytes=1 << 40, keep_seconds=0)
    assert os.listdir(os.path.join(store.root, "staging")) == []


def test_two_racing_publishers_one_wins(store):
    wins = []
    barrier = threading.Barrier(8)

    def race():
        lock = PublishLock(os.path.join(store.root, "locks", f"{reference_key(REF)}.lock"))
        barrier.wait()
        if lock.try_acquire():
            wins.append(lock)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    wins[0].release()


def test_gc_removes_the_least_recently_used_but_never_one_in_use(store, tmp_path):
    for n in (1, 2, 3):
        store.publish(f"img:{n}", "sha256:" + f"{n}" * 64, image_id(n), staged(store, tmp_path, f"i{n}", "x" * n),
                      user=1000)
    uses = os.path.join(store.root, "uses")
    now = time.time()
    for n, age in ((1, 3 * 86400), (2, 86400), (3, 10)):
        path = os.path.join(uses, f"{image_id(n)}.{os.getuid()}.node1")
        open(path, "w").close()
        os.utime(path, (now - age, now - age))
    for n in (1, 2, 3):                           # published nine days ago
        meta = os.path.join(store.root, "images", f"{image_id(n)}.json")
        with open(meta) as f:
            data = json.load(f)
        with open(meta, "w") as f:
            json.dump({**data, "created": now - 9 * 86400}, f)
    # a planted use: a file named for another user than its owner does not count
    planted = os.path.join(uses, f"{image_id(1)}.{OTHER}.node9")
    open(planted, "w").close()
    infos = {i.image_id: i for i in store.images()}
    assert infos[image_id(1)].users == (os.getuid(),)
    size = infos[image_id(1)].size
    removed = store.gc(max_bytes=size, keep_seconds=3600)
    assert [i.image_id for i in removed] == [image_id(1), image_id(2)]
    assert [i.image_id for i in store.images()] == [image_id(3)]
    assert store.lookup("img:1", max_age=None) is None and store.lookup("img:3", max_age=None)
    # the one in use stays even over the cap
    assert store.gc(max_bytes=0, keep_seconds=3600) == []


def test_a_waiting_rank_gets_the_image_or_the_publishers_error(store, tmp_path):
    since = time.time()
    said = []
    lock = store.lock(REF)
    assert lock.try_acquire()

    def publish():
        time.sleep(0.3)
        store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
        lock.release()

    t = threading.Thread(target=publish)
    t.start()
    found = wait_published(store, REF, since=since, timeout=30, say=said.append, interval=0.05)
    t.join()
    assert found.image_id == image_id(1)
    assert len(said) == 1 and "fetching it" in said[0]
    since = time.time()
    store.record_failure("broken:1", "pulling broken:1: manifest unknown")
    with pytest.raises(StoreError, match="manifest unknown"):
        wait_published(store, "broken:1", since=since, timeout=30, interval=0.05)
    with pytest.raises(StoreError, match="within 0 s"):
        wait_published(store, "never:1", since=since, timeout=0.1, interval=0.05)


def test_a_user_records_a_use_only_under_their_own_name(store, tmp_path):
    store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    store.note_use(image_id(1))
    store.note_use("../../etc/passwd")                        # not an id: nothing
    [entry] = os.listdir(os.path.join(store.root, "uses"))
    assert entry.startswith(f"{image_id(1)}.{os.getuid()}.")
    json.dumps(store.images())


def test_a_use_dated_in_the_future_does_not_pin_an_image(store, tmp_path):
    """Found by a hostile review: a user's use file with a time in 2100 kept gc off the image for
    good; a use counts at most as now."""
    store.publish(REF, "sha256:" + "e" * 64, image_id(1), staged(store, tmp_path, "a"), user=1000)
    meta = os.path.join(store.root, "images", f"{image_id(1)}.json")
    with open(meta) as f:
        data = json.load(f)
    with open(meta, "w") as f:
        json.dump({**data, "created": time.time() - 30 * 86400}, f)
    future = os.path.join(store.root, "uses", f"{image_id(1)}.{os.getuid()}.node1")
    open(future, "w").close()
    os.utime(future, (4102444800, 4102444800))                    # 2100-01-01
    assert store.images()[0].last_used <= time.time()
    assert [i.image_id for i in store.gc(max_bytes=0, keep_seconds=3600)] == []     # used "now": kept
    os.utime(future, (time.time() - 2 * 3600,) * 2)
    assert [i.image_id for i in store.gc(max_bytes=0, keep_seconds=3600)] == [image_id(1)]


def test_a_lock_taken_over_is_never_removed_by_its_old_holder(store, monkeypatch):
    monkeypatch.setattr(imagestore, "HEARTBEAT", 0.05)
    old, new = store.lock(REF), store.lock(REF)
    assert old.try_acquire()
    past = time.time() - imagestore.STALE_AFTER - 5
    old._stop.set()                                           # a holder thought dead: no heartbeat
    old._thread.join()
    os.utime(old.path, (past, past))
    assert new.try_acquire()
    old.release()                                             # the old holder comes back and lets go
    assert os.path.exists(new.path) and new._ours()
    new.release()
    assert not os.path.exists(new.path)


def test_a_waiting_rank_hears_when_the_publisher_died(store):
    lock = store.lock(REF)
    assert lock.try_acquire()
    lock._stop.set()
    lock._thread.join()
    past = time.time() - imagestore.STALE_AFTER - 5
    os.utime(lock.path, (past, past))                          # killed: its lock no longer kept fresh
    with pytest.raises(imagestore.PublisherGone):
        wait_published(store, REF, since=time.time(), timeout=30, interval=0.05, gone_after=0.2)

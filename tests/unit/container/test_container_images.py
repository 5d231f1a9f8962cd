"""The Apptainer image cache (tether.container.images): one conversion however many ranks ask,
nothing half-made visible, what other users planted never used; `tether images ls`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tether.container.images import DEFAULT_USER_CACHE, ImageCache, image_key, user_cache_dir
from tether.container.spec import LaunchError

from container_helpers import _as_user


# ---- the image cache -------------------------------------------------------------------------
@pytest.fixture
def fake_apptainer(fake_runtimes):
    """The testing kit's apptainer (its `build` records each conversion and takes build_seconds)."""
    fake_runtimes.configure(build_seconds=0.5)
    return fake_runtimes


def _conversions(fakes) -> list[str]:
    return [c["source"] for c in fakes.calls("apptainer") if c["argv"][1] == "build"]


def _ensure_in_subprocess(root, fakes, source, env):
    exe = fakes.bin_dir / "apptainer"
    code = (f"from tether.container.images import ImageCache;"
            f"print(ImageCache({str(root)!r}).ensure({source!r}, build=[{str(exe)!r}, 'build']))")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_six_concurrent_first_uses_convert_exactly_once(tmp_path, fake_apptainer):
    root = tmp_path / "images"
    root.mkdir()
    env = dict(os.environ)
    procs = [_ensure_in_subprocess(root, fake_apptainer, "docker://busybox:1.36", env) for _ in range(6)]
    outputs = [p.communicate(timeout=60) for p in procs]
    paths = {out.strip() for out, _ in outputs}
    assert all(p.returncode == 0 for p in procs)
    assert _conversions(fake_apptainer) == ["docker://busybox:1.36"]        # one conversion
    (path,) = paths
    assert Path(path).read_bytes() == b"SIF_MAGICdocker://busybox:1.36" and Path(path).parent == root
    # progress: the converting rank says what and how long; ranks that came meanwhile say they wait
    errs = "".join(err for _, err in outputs)
    assert errs.count("tether: converting docker://busybox:1.36 into a SIF image (apptainer) ...") == 1
    assert errs.count("tether: converted docker://busybox:1.36: 0.0 MB in ") == 1
    assert errs.count("tether: waiting for another rank's conversion of docker://busybox:1.36") >= 1
    assert not [e for e in os.listdir(root) if e.endswith(".partial")]
    assert [(i.source, i.path) for i in ImageCache(str(root)).entries()] == [("docker://busybox:1.36", path)]


def test_killed_or_failed_conversion_never_becomes_visible(tmp_path, fake_apptainer):
    root = tmp_path / "images"
    root.mkdir()
    env = dict(os.environ)
    fake_apptainer.configure(build_seconds=30)
    proc = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    deadline = time.monotonic() + 20
    while not _conversions(fake_apptainer) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    cache = ImageCache(str(root))
    assert cache.lookup("docker://big") is None and list(cache.entries()) == []
    fake_apptainer.configure(build_seconds=0, build_fails=True)
    failed = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    _, err = failed.communicate(timeout=60)
    assert failed.returncode != 0 and "cannot convert docker://big into a SIF image" in err
    assert "manifest unknown" in err
    assert cache.lookup("docker://big") is None
    assert not [e for e in os.listdir(root) if e.endswith(".partial")]     # the killed one's is gone too
    fake_apptainer.configure(build_fails=False)
    ok = _ensure_in_subprocess(root, fake_apptainer, "docker://big", env)
    assert ok.communicate(timeout=60)[0].strip() == str(root / (image_key("docker://big") + ".sif"))
    assert cache.prune(0) == [str(root / (image_key("docker://big") + ".sif"))]
    assert list(cache.entries()) == []


def test_nobody_uses_an_image_another_user_planted(tmp_path):
    """The shared cache counts only root's regular files; a user's cache only that user's."""
    root = tmp_path / "images"
    root.mkdir()
    planted = root / (image_key("docker://python:3") + ".sif")
    planted.write_text("evil")
    os.chown(planted, 1002, 1002)
    assert ImageCache(str(root), uid=0).lookup("docker://python:3") is None
    assert ImageCache(str(root), uid=1003, user_dir=str(tmp_path / "c")).lookup("docker://python:3") is None
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / (image_key("docker://python:3") + ".sif")).write_text("evil")
    os.chown(theirs / (image_key("docker://python:3") + ".sif"), 1002, 1002)
    assert ImageCache(str(root), uid=1003, user_dir=str(theirs)).lookup("docker://python:3") is None
    os.chown(theirs, 1002, 1002)
    with pytest.raises(LaunchError, match="is not a directory of uid 1003"):
        ImageCache(str(root), uid=1003, user_dir=str(theirs)).ensure("docker://x", build=["false"])


def test_root_prune_never_touches_files_a_user_controls(tmp_path):
    """Regression (issue 12): a user planted users/evil -> a victim's directory in the old 1777 area,
    and root's prune deleted the victim's files. Root now prunes only its shared cache."""
    root = tmp_path / "images"
    (root / "users").mkdir(parents=True)
    os.chmod(root / "users", 0o1777)
    victim = tmp_path / "victim"
    victim.mkdir()
    key = image_key("docker://app")
    for suffix in (".sif", ".json", ".lock"):
        (victim / (key + suffix)).write_text("{}" if suffix == ".json" else "mine")
    old = time.time() - 100 * 86400
    for f in victim.iterdir():
        os.utime(f, (old, old))
    (root / "users" / "evil").symlink_to(victim)
    (root / "users" / "1003").mkdir()
    os.chown(root / "users" / "1003", 1002, 1002)
    cache = ImageCache(str(root), uid=0)
    assert cache.prune(1) == [] and list(cache.entries()) == []
    assert sorted(p.name for p in victim.iterdir()) == sorted(key + s for s in (".sif", ".json", ".lock"))
    with pytest.raises(LaunchError, match="give a number of days >= 0"):
        cache.prune(-5)


def test_ls_skips_a_fifo_named_like_metadata_instead_of_hanging(public_dir):
    tmp_path = public_dir
    cache_dir = tmp_path / "mine"
    cache_dir.mkdir()
    key = image_key("docker://a")
    (cache_dir / (key + ".sif")).write_text("sif")
    os.mkfifo(cache_dir / (key + ".json"))
    os.chown(cache_dir, 1003, 1003)
    for f in cache_dir.iterdir():
        os.chown(f, 1003, 1003, follow_symlinks=False)
    signal.alarm(20)                                   # the old code blocked here forever
    try:
        entries = _as_user(1003, lambda: [(i.source, i.size) for i in ImageCache(
            str(tmp_path / "shared"), uid=1003, user_dir=str(cache_dir)).entries()])
    finally:
        signal.alarm(0)
    assert entries == [("?", 3)]


def test_a_users_conversion_goes_to_their_own_cache(public_dir):
    from tether.testing.runtimes import FakeRuntimes

    tmp_path = public_dir
    exe = FakeRuntimes(tmp_path / "fakes").bin_dir / "apptainer"          # reachable by the user
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 1003, 1003)
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, "HOME": str(home)}
    mine = user_cache_dir(DEFAULT_USER_CACHE, 1003, str(home))
    result = _as_user(1003, lambda: ImageCache(str(shared), user_dir=mine).ensure(
        "docker://x:1", build=[str(exe), "build"], env=env))
    assert result == str(home / ".cache" / "tether" / "images" / (image_key("docker://x:1") + ".sif"))
    assert os.listdir(shared) == []


def test_apptainer_conversion_is_one_exact_build(fp, tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    key = image_key("docker://python:3.12")

    def build(process):
        Path(process.args[-2]).write_text("SIF")

    fp.register(["/usr/bin/apptainer", "build", "--disable-cache", fp.any(min=1, max=1), "docker://python:3.12"],
                callback=build)
    path = ImageCache(str(root)).ensure("docker://python:3.12",
                                        build=["/usr/bin/apptainer", "build", "--disable-cache"])
    assert path == str(root / f"{key}.sif") and Path(path).read_text() == "SIF"
    assert ImageCache(str(root)).ensure("docker://python:3.12", build=["/usr/bin/apptainer", "build"]) == path
    assert fp.call_count(["/usr/bin/apptainer", "build", fp.any()]) == 1          # the second use: cached


def test_tether_images_ls_is_a_table_with_readable_sizes(monkeypatch, capsys, tmp_path):
    """`tether images ls`: aligned columns, sizes as podman shows them (it printed raw bytes)."""
    import argparse

    from tether.cli import containers
    from tether.container.runtimes import StoredImage

    class Store:
        def stored(self, env):
            return [StoredImage(name="127.0.0.1:17005/team/app:1", size=4281615, last_used=0.0, where="/var/tmp/s"),
                    StoredImage(name="localhost/x:2", size=12_500_000_000, last_used=0.0, where="/var/tmp/s"),
                    StoredImage(name="tiny", size=512, last_used=0.0, where="/var/tmp/s")]

    monkeypatch.setattr(containers, "_image_runtimes", lambda settings, names: [("podman", Store())])
    config = tmp_path / "tether.yaml"
    config.write_text("job_storage_root: /var/lib/tether/jobs\n")
    assert containers.images(argparse.Namespace(action="ls", runtime=None, config=str(config))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUNTIME", "SIZE", "LAST", "USED", "IMAGE", "WHERE"]
    sizes = [" ".join(line.split()[1:3]) for line in lines[1:]]
    assert sizes == ["4.3 MB", "12.5 GB", "512 B"]
    assert len({line.index(size) + len(size) for line, size in zip(lines[1:], sizes)}) == 1   # right-aligned
    assert len({line.index("/var/tmp/s") for line in lines[1:]}) == 1      # one column

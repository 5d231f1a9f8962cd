"""Each user's own directories on a node (hooks.layout: user_dir_bases): the stores and podman's
run directory live where only root can make them, never where another user can take a user's
name first; root's tools never work inside a store another user made (issue 39, findings 2, 5)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tether.container.runtimes import existing_store, store_directory
from tether.container.runtimes.podman import Podman
from tether.container.spec import LaunchError
from tether.hooks.config import default_config
from tether.hooks.layout import USER_RUN_ROOT, user_dir_base, user_dir_bases

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root: files of other users")


@pytest.fixture
def place():
    """A directory of the test's: a sticky world-writable 'shared' place, as /var/tmp is."""
    base = Path(tempfile.mkdtemp(prefix="tether-user-dirs-", dir="/var/tmp"))
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_default_stores_and_run_directory_are_in_root_only_places():
    config = default_config()
    assert config.user_dir_bases() == [USER_RUN_ROOT, "/var/lib/tether/users"]
    assert config.runtime("podman")["store"] == "/var/lib/tether/users/{uid}/podman"
    assert config.runtime("enroot")["store"] == "/var/lib/tether/users/{uid}/enroot"
    # a store whose {uid} is not a whole component is the user's own making: no base for root
    assert user_dir_base("/var/tmp/tether-podman-{uid}") is None
    assert user_dir_base("/scratch/{uid}") == "/scratch"
    assert user_dir_bases(["/a/{uid}/p", "/a/{uid}/e", "", "/b/x{uid}"]) == [USER_RUN_ROOT, "/a"]


def test_root_never_lists_a_store_another_user_planted(place):
    """Finding 2: root's `tether images ls` ran podman inside /var/tmp/tether-podman-0 that a user
    had made (podman's database, locks and layers as root in the user's directory; a FIFO there
    stalled root). The store is checked first, and podman never runs."""
    calls = place / "calls"
    fake = place / "podman"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\necho '[]'\n")
    fake.chmod(0o755)
    planted = place / "tether-podman-0"
    planted.mkdir(mode=0o777)
    os.chown(planted, NOBODY, NOBODY)
    adapter = Podman({"binary": str(fake), "store": str(place / "tether-podman-{uid}")})
    with pytest.raises(LaunchError, match="not a directory of yours"):
        adapter.stored({"PATH": "/usr/bin:/bin"})
    assert not calls.exists()
    # a symlink to a directory of root's, swapped in for the store: refused, not followed
    planted.rmdir()
    (place / "roots").mkdir(mode=0o700)
    planted.symlink_to(place / "roots")
    with pytest.raises(LaunchError, match="not a directory of yours"):
        adapter.stored({"PATH": "/usr/bin:/bin"})
    assert not calls.exists() and os.listdir(place / "roots") == []


def test_no_store_means_nothing_stored_and_nothing_made(place):
    adapter = Podman({"binary": "/bin/false", "store": str(place / "users" / "{uid}" / "podman")})
    assert adapter.stored({}) == []
    assert not (place / "users").exists()
    assert existing_store(str(place / "users" / "{uid}" / "podman"), NOBODY) is None


def _in_child_as(uid: int, fn):
    """``fn()`` in a child process running as ``uid``; its result or its exception's text."""
    import multiprocessing

    def run(queue):
        os.setgid(uid)
        os.setuid(uid)
        try:
            queue.put(("ok", fn()))
        except Exception as exc:        # noqa: BLE001 -- reported to the test
            queue.put(("error", f"{type(exc).__name__}: {exc}"))

    queue = multiprocessing.get_context("fork").Queue()
    proc = multiprocessing.get_context("fork").Process(target=run, args=(queue,))
    proc.start()
    proc.join(30)
    return queue.get(timeout=5)


def test_a_user_cannot_make_another_users_store_first(place):
    """Finding 5: any user could make /var/tmp/tether-podman-<victim uid> before the victim's first
    job, and every container step of the victim failed until an admin removed it. In the default
    form the directory named after the user is root's to make, in a base nobody else writes."""
    users = place / "users"
    users.mkdir(mode=0o755)
    template = str(users / "{uid}" / "podman")
    # the attacker (uid 65534) cannot make the victim's (1003) directory: the base is root's
    said = _in_child_as(NOBODY, lambda: os.mkdir(users / "1003"))
    assert said[0] == "error" and "Permission denied" in said[1]
    # the victim's own launcher, before root made the directory: a clear message, nothing made
    said = _in_child_as(1003, lambda: store_directory(template, 1003))
    assert said[0] == "error" and f"{users}/1003 does not exist: root makes it for you" in said[1]
    # once root made it (as the SPANK plugin does): the store is the user's, private
    (users / "1003").mkdir(mode=0o700)
    os.chown(users / "1003", 1003, 1003)
    assert _in_child_as(1003, lambda: store_directory(template, 1003)) == ("ok", f"{users}/1003/podman")
    assert (os.stat(users / "1003" / "podman").st_uid, os.stat(users / "1003" / "podman").st_mode & 0o777) == (1003, 0o700)


def test_a_base_others_can_write_is_refused(place):
    """A base where other users can make entries gives nobody a store: tether says what to fix."""
    template = str(place / "{uid}" / "podman")          # place is 1777, as /var/tmp
    (place / "1003").mkdir(mode=0o700)
    os.chown(place / "1003", 1003, 1003)
    said = _in_child_as(1003, lambda: store_directory(template, 1003))
    assert said[0] == "error" and "must be a directory of root's that group and others cannot write" in said[1]


def test_podmans_run_directory_never_comes_from_the_jobs_environment(place):
    """Issue 46: a login node's XDG_RUNTIME_DIR (/run/user/<uid>), exported with the job, made
    podman's records disagree with the next job's ("database configuration mismatch", exit 125 on
    every container step). podman's run directory is the node's own for the user."""
    adapter = Podman({"store": str(place / "s-{uid}")})
    assert adapter.run_dir(1003) == f"{USER_RUN_ROOT}/1003"
    env = _in_child_as(1003, lambda: adapter.base_env({"XDG_RUNTIME_DIR": "/run/user/1003", "PATH": "/bin"}))
    assert env == ("ok", {"XDG_RUNTIME_DIR": f"{USER_RUN_ROOT}/1003", "PATH": "/bin"})
    args = adapter.store_args({"XDG_RUNTIME_DIR": "/run/user/1003"}, uid=1003)
    assert args[args.index("--runroot") + 1] == f"{USER_RUN_ROOT}/1003/tether-podman/storage"
    # podman's run directory that root did not make: a clear message (podman would make it in /tmp)
    said = _in_child_as(1003, lambda: Podman({"store": str(place / "s-{uid}"),
                                              "env": {"XDG_RUNTIME_DIR": str(place / "no-such-run")}})
                        .store_args({}, create=True))
    assert said[0] == "error" and "does not exist: root makes it for you" in said[1]

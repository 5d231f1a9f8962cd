"""The image service (container/imageservice.py): its answers, its one-publisher rule, what it
adds to an image's files, its protocol. The fetcher here is tether's own interface with podman
replaced by files (tests/cluster/test_image_store_cluster.py runs the real one)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import tarfile
import sys
import threading
import time

import pytest

from tether.container import imageservice
from tether.container.imageservice import (FetchError, NeedsCredentials, add_mount_targets, ask,
                                           publish_reference, serve_connection)
from tether.container.imagestore import ImageStore

REF = "registry.example:5000/tether/busybox:1"


class FilesFetcher:
    """A fetcher whose registry is a dict: reference -> (manifest, image id) or an exception."""

    def __init__(self, tmp_path, registry):
        self.tmp_path, self.registry, self.pulls, self.made, self.forgotten = tmp_path, registry, [], [], []
        self.sessions = 0

    @contextlib.contextmanager
    def session(self):
        self.sessions += 1
        yield self

    def pull(self, reference):
        self.pulls.append(reference)
        found = self.registry[reference]
        if isinstance(found, Exception):
            raise found
        return found

    def config(self, image_id):
        return {"env": ["PATH=/usr/bin:/bin", "FROM_IMAGE=1"], "entrypoint": [], "cmd": ["/bin/sh"], "workdir": ""}

    def squashfs(self, image_id, target):
        tree = self.tmp_path / f"tree-{image_id[:8]}"
        (tree / "etc").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mksquashfs", str(tree), target, "-quiet", "-noappend", "-no-progress"], check=True,
                       capture_output=True)
        self.made.append(image_id)

    def forget(self, image_id):
        self.forgotten.append(image_id)


@pytest.fixture
def store(tmp_path):
    s = ImageStore(str(tmp_path / "store"), os.getuid())
    s.setup()
    return s


def test_one_fetch_then_answers_from_the_store_until_the_reference_is_old(store, tmp_path):
    fetcher = FilesFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64)})
    said = []
    first = publish_reference(store, fetcher, REF, resolve_every=900, user=1000, say=said.append)
    # kept under the manifest's digest: what the registry named, which names every layer
    assert first["published"]["image_id"] == "a" * 64 and fetcher.pulls == [REF] and fetcher.made == ["1" * 64]
    assert said[0].startswith(f"fetching {REF} into the cluster image store")
    assert fetcher.forgotten == ["1" * 64]                        # the scratch store keeps nothing
    again = publish_reference(store, fetcher, REF, resolve_every=900, user=1001)
    assert again == first and fetcher.pulls == [REF]              # from the store: no registry
    assert store.lookup(REF, max_age=None).config["env"] == ["PATH=/usr/bin:/bin", "FROM_IMAGE=1"]
    # resolved too long ago: asked again; the tag names the same image -- nothing made again
    publish_reference(store, fetcher, REF, resolve_every=-1, user=1000)
    assert fetcher.pulls == [REF, REF] and fetcher.made == ["1" * 64]
    assert fetcher.forgotten == ["1" * 64] * 2 and fetcher.sessions == 2
    # the tag moved: the new image is made and published, the reference points at it
    fetcher.registry[REF] = ("sha256:" + "b" * 64, "2" * 64)
    moved = publish_reference(store, fetcher, REF, resolve_every=-1, user=1000)
    assert moved["published"]["image_id"] == "b" * 64 and fetcher.made == ["1" * 64, "2" * 64]
    assert store.lookup(REF, max_age=None).image_id == "b" * 64


def test_the_same_manifest_under_another_name_is_not_made_twice(store, tmp_path):
    fetcher = FilesFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64), "alias:1": ("sha256:" + "a" * 64, "1" * 64)})
    publish_reference(store, fetcher, REF, resolve_every=900, user=1000)
    publish_reference(store, fetcher, "alias:1", resolve_every=900, user=1000)
    assert fetcher.made == ["1" * 64] and store.lookup("alias:1", max_age=None).image_id == "a" * 64


def test_an_image_with_another_images_config_never_stands_for_it(store, tmp_path):
    """Found by a hostile review: podman names an image by its config's digest, so an image pushed
    with a popular image's config and layers of its own has the popular image's id. The store
    keeps images by manifest digest: the victim's reference gets its own manifest's image."""
    fetcher = FilesFetcher(tmp_path, {"evil.example/x:1": ("sha256:" + "e" * 64, "1" * 64),
                                      REF: ("sha256:" + "a" * 64, "1" * 64)})
    publish_reference(store, fetcher, "evil.example/x:1", resolve_every=900, user=1666)
    publish_reference(store, fetcher, REF, resolve_every=900, user=1000)
    assert fetcher.made == ["1" * 64, "1" * 64]                   # made from the victim's own pull
    assert store.lookup(REF, max_age=None).image_id == "a" * 64
    assert store.lookup("evil.example/x:1", max_age=None).image_id == "e" * 64


def test_private_and_failing_references(store, tmp_path):
    fetcher = FilesFetcher(tmp_path, {REF: NeedsCredentials(f"{REF} needs credentials: unauthorized"),
                                      "gone:1": FetchError("pulling gone:1 failed: manifest unknown")})
    assert publish_reference(store, fetcher, REF, resolve_every=900, user=1000) == {
        "private": f"{REF} needs credentials: unauthorized"}
    assert publish_reference(store, fetcher, REF, resolve_every=900, user=1000)["private"]
    assert fetcher.pulls == [REF]                                 # private: not asked again for a while
    assert publish_reference(store, fetcher, "gone:1", resolve_every=900, user=1000) == {
        "error": "pulling gone:1 failed: manifest unknown"}
    publish_reference(store, fetcher, "gone:1", resolve_every=900, user=1000)
    assert fetcher.pulls == [REF, "gone:1", "gone:1"]             # a failure: the next rank tries again
    assert store.images() == [] and os.listdir(os.path.join(store.root, "staging")) == []


def test_while_another_publisher_holds_the_reference_the_answer_is_wait(store, tmp_path):
    lock = store.lock(REF)
    assert lock.try_acquire()
    try:
        fetcher = FilesFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64)})
        answer = publish_reference(store, fetcher, REF, resolve_every=900, user=1000)
        assert answer["wait"].endswith(f"pid {os.getpid()}") and fetcher.pulls == []
    finally:
        lock.release()


def test_a_failed_squashfs_publishes_nothing(store, tmp_path, monkeypatch):
    fetcher = FilesFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64)})

    def broken(image_id, target):
        with open(target, "wb") as f:
            f.write(b"hsqs" + b"\0" * 36 + (1 << 40).to_bytes(8, "little") + b"\0" * 60)   # claims 1 TiB

    monkeypatch.setattr(fetcher, "squashfs", broken)
    answer = publish_reference(store, fetcher, REF, resolve_every=900, user=1000)
    assert "truncated" in answer["error"]
    assert store.lookup(REF, max_age=None) is None and os.listdir(os.path.join(store.root, "staging")) == []
    assert store.publisher(REF) is None                           # the lock went with the attempt


def _tar(*members) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                data = b"own\n"
                info.size, info.uid, info.mode = len(data), 1000, 0o4750
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_podmans_mount_targets_are_added_where_the_image_lacks_them():
    source = io.BytesIO(_tar(("./etc", "dir"), ("./etc/hosts", "file"), ("./bin", "dir"), ("./bin/tool", "file")))
    sink = io.BytesIO()
    add_mount_targets(source, sink)
    sink.seek(0)
    with tarfile.open(fileobj=sink) as tar:
        members = {m.name.lstrip("./"): m for m in tar.getmembers()}
        assert tar.extractfile("./etc/hosts").read() == b"own\n"            # the image's own stays
        assert tar.extractfile("./bin/tool").read() == b"own\n"
    tool = members["bin/tool"]
    assert (tool.uid, tool.mode) == (1000, 0o4750)                          # owners and modes as they were
    for path in ("proc", "sys", "dev", "run", "tmp", "var", "var/tmp"):
        assert members[path].isdir(), path
    assert members["tmp"].mode == 0o1777 and members["var/tmp"].mode == 0o1777
    for path in ("etc/passwd", "etc/group", "etc/hostname", "etc/resolv.conf", "run/.containerenv"):
        assert members[path].isfile() and members[path].size == 0, path
    assert members["etc/mtab"].issym() and members["etc/mtab"].linkname == "/proc/mounts"
    assert list(members).count("etc/hosts") == 1


def test_the_protocol_over_a_socket_with_the_askers_uid(store, tmp_path, monkeypatch):
    fetcher = FilesFetcher(tmp_path, {"docker.io/library/busybox:1": ("sha256:" + "a" * 64, "1" * 64)})
    path = str(tmp_path / "images.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    seen = []

    def serve_n(n):
        for _ in range(n):
            conn, _ = server.accept()
            with conn:
                seen.append(imageservice.peer_uid(conn))
                serve_connection(conn, store, fetcher, resolve_every=900)

    t = threading.Thread(target=serve_n, args=(4,))
    t.start()
    said = []
    answer = ask(path, "busybox:1", say=said.append, timeout=30)        # as a user writes it: qualified
    assert answer["published"]["image_id"] == "a" * 64 and said and seen == [os.getuid()]
    assert store.images()[0].references == ("docker.io/library/busybox:1",)
    assert "registry images only" in ask(path, "/some/rootfs", say=said.append, timeout=30)["error"]
    assert "expected a path" in ask(path, "Not A Reference", say=said.append, timeout=30)["error"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(path)
        raw.sendall(b"not json\n")
        assert "expects one JSON line" in json.loads(raw.makefile("rb").readline())["error"]
    t.join()
    server.close()


def test_a_client_that_never_asks_is_dropped_and_a_socket_of_another_user_is_not_asked(store, tmp_path, monkeypatch):
    monkeypatch.setattr(imageservice, "REQUEST_SECONDS", 0.2)
    client, server = socket.socketpair()
    with client, server:
        fetcher = FilesFetcher(tmp_path, {})
        started = threading.Event()

        def serve():
            started.set()
            serve_connection(server, store, fetcher, resolve_every=900)

        t = threading.Thread(target=serve)
        t.start()
        t.join(timeout=10)
        assert started.is_set() and not t.is_alive() and fetcher.pulls == []
    path = str(tmp_path / "other.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    with listener:
        with pytest.raises(ValueError, match="another user listens on it"):
            ask(path, REF, say=lambda t: None, timeout=5, service_uid=os.getuid() + 1)


def test_a_manifest_digest_podman_did_not_give_is_an_error(store, tmp_path):
    fetcher = FilesFetcher(tmp_path, {REF: ("", "1" * 64)})
    assert "gave no manifest digest" in publish_reference(store, fetcher, REF, resolve_every=900, user=1)["error"]
    assert fetcher.forgotten == ["1" * 64] and store.images() == []


FULL_DISK = r'''
import json, os, subprocess, sys, tempfile
from tether.container.imageservice import PodmanFetcher, publish_reference
from tether.container.imagestore import ImageStore

base, ref = sys.argv[1], sys.argv[2]
root = os.path.join(base, "store")
os.makedirs(root)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", root], check=True)
store = ImageStore(root, os.getuid())
store.setup()


class Imported(PodmanFetcher):
    """The real podman and tar2sqfs; the pull replaced by an import of a local tar (no registry)."""

    def pull(self, reference):
        out = self._run("import", "--quiet", os.path.join(base, "image.tar"), "tether-test/full:1")
        image_id = out.stdout.decode().strip()
        return "sha256:" + "c" * 64, image_id


run = tempfile.mkdtemp(prefix="tfd", dir="/tmp")          # podman's runroot: at most 50 characters
fetcher = Imported("podman", os.path.join(base, "scratch"), {"PATH": "/usr/bin:/bin", "HOME": base,
                   "XDG_RUNTIME_DIR": run}, ["--runtime", "runc"])
full = publish_reference(store, fetcher, ref, resolve_every=900, user=1000)
state = {"images": sorted(os.listdir(os.path.join(root, "images"))),
         "staging": sorted(os.listdir(os.path.join(root, "staging"))), "publisher": store.publisher(ref)}
subprocess.run(["mount", "-o", "remount,size=64m", root], check=True)     # space freed
again = publish_reference(store, fetcher, ref, resolve_every=900, user=1000)
fetcher.empty()
subprocess.run(["rm", "-rf", run])
print(json.dumps({"full": full, "state": state, "again": again}))
'''


def test_a_full_disk_fails_the_fetch_with_its_words_and_publishes_nothing(tmp_path):
    """The store's filesystem full while the squashfs is written (real podman export and tar2sqfs
    into a 2 MiB tmpfs, in a mount namespace of the test's own): the fetch fails with tar2sqfs's
    words and the space left -- not a hang: podman export never sees its pipe break --, nothing is published or left in staging, the lock goes; once
    there is space the next fetch publishes it."""
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "data").write_bytes(os.urandom(8 << 20))       # incompressible: 8 MiB > 2 MiB
    subprocess.run(["tar", "-C", str(tree), "-cf", str(tmp_path / "image.tar"), "."], check=True)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", FULL_DISK,
                           str(tmp_path), REF], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    # tar2sqfs's own words ("I/O error") and the space left where it wrote
    assert re.fullmatch(r"tar2sqfs failed: .+; [01] MiB free in .*/store/staging", got["full"]["error"]), got
    assert got["state"] == {"images": [], "staging": [], "publisher": None}, got
    assert got["again"]["published"]["image_id"] == "c" * 64, got


def test_one_user_can_make_the_store_fetch_only_so_many_images_an_hour(store, tmp_path):
    """fetches_per_hour bounds what one local user can make the service fetch (any user may ask
    for any public image): beyond it the answer is "limit" (their ranks pull into their own
    store), other users and answers from the store are not affected, and the hour slides."""
    refs = [f"registry.example:5000/tether/img{n}:1" for n in range(4)]
    fetcher = FilesFetcher(tmp_path, {r: ("sha256:" + f"{n + 1:064x}", f"{n + 11:064x}") for n, r in enumerate(refs)})
    answers = [publish_reference(store, fetcher, r, resolve_every=900, user=1000, fetches_per_hour=2) for r in refs[:3]]
    assert [next(iter(a)) for a in answers] == ["published", "published", "limit"], answers
    assert "fetch 2 images within the last hour" in answers[2]["limit"] and "fetches_per_hour, is 2" in answers[2]["limit"]
    assert fetcher.pulls == refs[:2] and store.lookup(refs[2], max_age=None) is None
    assert store.publisher(refs[2]) is None                                 # the lock went with the answer
    # a published one is still answered; another user is counted apart; 0 is no limit
    assert "published" in publish_reference(store, fetcher, refs[0], resolve_every=900, user=1000, fetches_per_hour=2)
    assert "published" in publish_reference(store, fetcher, refs[2], resolve_every=900, user=1001, fetches_per_hour=2)
    assert "published" in publish_reference(store, fetcher, refs[3], resolve_every=900, user=1000, fetches_per_hour=0)
    # an hour later the user may fetch again; a count written in the future does not pin it
    assert store.charge_fetch(1000, 2, now=time.time() + 3601) is None
    with open(os.path.join(store.root, "fetches", "1000"), "w") as f:
        f.write(f"{time.time() + 86400}\n" * 5)
    assert store.charge_fetch(1000, 2) is None
    assert os.stat(os.path.join(store.root, "fetches")).st_mode & 0o777 == 0o700
    # a limit above what one read of the count would hold is still kept (the whole file is read)
    now = time.time()
    with open(os.path.join(store.root, "fetches", "1002"), "w") as f:
        f.write("".join(f"{now - 1:.3f}\n" for _ in range(4999)))
    assert store.charge_fetch(1002, 5000, now=now) is None and store.charge_fetch(1002, 5000, now=now) == 5000


class FormsFetcher(FilesFetcher):
    """FilesFetcher with the service's apptainer_form on (its squashfs is zstd, as the real one's)."""

    apptainer_form = True
    env = dict(os.environ)

    def squashfs(self, image_id, target):
        tree = self.tmp_path / f"tree-{image_id[:8]}"
        (tree / "etc").mkdir(parents=True, exist_ok=True)
        (tree / "etc" / "hostname").write_text("image\n")
        subprocess.run(["mksquashfs", str(tree), target, "-quiet", "-noappend", "-no-progress", "-comp", "zstd"],
                       check=True, capture_output=True)
        self.made.append(image_id)


def test_the_apptainer_form_is_published_with_the_image_and_added_to_one_published_without(store, tmp_path):
    """With apptainer_form, a fetch publishes beside the zstd squashfs a gzip one (what Apptainer
    before 1.4 can start) with the same files plus /.singularity.d: the image's ENV in
    10-docker2singularity.sh and a 99-base.sh (after which Apptainer puts the job's variables in);
    an image published without it gets it at its next resolve, without being made again; a
    failed form publishes nothing; tether images rm takes both, and ls counts both."""
    import struct

    plain = FilesFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64)})
    publish_reference(store, plain, REF, resolve_every=900, user=1000)
    found = store.lookup(REF, max_age=None)
    assert store.apptainer_form(found) is None
    fetcher = FormsFetcher(tmp_path, {REF: ("sha256:" + "a" * 64, "1" * 64), "other:1": ("sha256:" + "b" * 64, "2" * 64)})
    said = []
    publish_reference(store, fetcher, REF, resolve_every=-1, user=1000, say=said.append)
    form = store.apptainer_form(store.lookup(REF, max_age=None))
    assert form == os.path.join(store.root, "images", "a" * 64 + ".apptainer.sqfs") and fetcher.made == []
    assert any(line.startswith(f"making the Apptainer image of {REF}") for line in said), said
    publish_reference(store, fetcher, "other:1", resolve_every=900, user=1000)
    other = store.apptainer_form(store.lookup("other:1", max_age=None))
    with open(other, "rb") as f:
        assert struct.unpack_from("<H", f.read(24), 20)[0] == 1                   # gzip
    assert oct(os.stat(other).st_mode & 0o777) == "0o444"
    listed = subprocess.run(["unsquashfs", "-d", "", "-lc", other], capture_output=True, text=True).stdout.split()
    assert {"/etc/hostname", "/.singularity.d/env/10-docker2singularity.sh",
            "/.singularity.d/env/99-base.sh"} <= set(listed), listed
    script = subprocess.run(["unsquashfs", "-cat", other, ".singularity.d/env/10-docker2singularity.sh"],
                            capture_output=True, text=True).stdout
    assert script == ('#!/bin/sh\nexport PATH="/usr/bin:/bin"\n'
                      'if [ -z "${FROM_IMAGE:-}" ]; then FROM_IMAGE="1"; fi; export FROM_IMAGE\n')
    sizes = {i.image_id: i.size for i in store.images()}
    assert sizes["b" * 64] == os.path.getsize(other) + os.path.getsize(store.image_path("b" * 64))
    # a form that cannot be made: the image is published without it (podman and enroot ranks are
    # never held back for it), said; staging is left empty; the next resolve makes it
    fetcher.registry["third:1"] = ("sha256:" + "c" * 64, "3" * 64)
    original = imageservice.write_apptainer_form
    said.clear()
    try:
        def broken(*args, **kwargs):
            raise FetchError("tar2sqfs of the Apptainer image failed: I/O error")
        imageservice.write_apptainer_form = broken
        answer = publish_reference(store, fetcher, "third:1", resolve_every=900, user=1000, say=said.append)
    finally:
        imageservice.write_apptainer_form = original
    assert answer["published"]["image_id"] == "c" * 64, answer
    assert store.apptainer_form(store.lookup("third:1", max_age=None)) is None
    assert any("could not be made (tar2sqfs of the Apptainer image failed: I/O error): Apptainer ranks convert"
               in line for line in said), said
    assert not os.listdir(os.path.join(store.root, "staging"))
    publish_reference(store, fetcher, "third:1", resolve_every=-1, user=1000)
    assert store.apptainer_form(store.lookup("third:1", max_age=None)) and fetcher.made == ["2" * 64, "3" * 64]
    store.remove("b" * 64)
    assert not os.path.exists(other) and not os.path.exists(store.image_path("b" * 64))
    # a form whose image went while it was made is gc's
    os.chmod(os.path.join(store.root, "images"), 0o755)
    os.unlink(store.image_path("c" * 64))
    store.gc(1 << 40, 0)
    assert not os.path.exists(store.form_path("c" * 64))


def test_an_image_with_its_own_singularity_d_keeps_its_files_in_the_apptainer_form(tmp_path):
    """An image that has /.singularity.d/env scripts of its own (made from a SIF, say): the form
    keeps them, adding only what is missing (a second entry of the same path would fail the
    squashfs writer: "File exists")."""
    from tether.container.imageservice import write_apptainer_form

    tree = tmp_path / "tree"
    (tree / ".singularity.d" / "env").mkdir(parents=True)
    (tree / ".singularity.d" / "env" / "10-docker2singularity.sh").write_text("export OWN=1\n")
    source, form = tmp_path / "img.sqfs", tmp_path / "form.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(source), "-quiet", "-noappend", "-no-progress", "-comp", "zstd"],
                   check=True)
    write_apptainer_form(str(source), str(form), ["FROM_CONFIG=1"], environ=dict(os.environ))
    script = subprocess.run(["unsquashfs", "-cat", str(form), ".singularity.d/env/10-docker2singularity.sh"],
                            capture_output=True, text=True).stdout
    listed = subprocess.run(["unsquashfs", "-d", "", "-lc", str(form)], capture_output=True, text=True).stdout.split()
    assert script == "export OWN=1\n" and "/.singularity.d/env/99-base.sh" in listed, listed


def test_the_apptainer_environment_script_keeps_values_whole_and_names_shell_words():
    """A value with the characters shell gives meaning to in double quotes, and a '}' (which
    would end a ${NAME:-value}), comes out whole; a name that is not a shell word is left out."""
    from tether.container.imageservice import apptainer_environment

    value = 'a}b"c$(id)`id`\\d\ne'
    script = apptainer_environment([f"V={value}", "PATH=/x:/y", "A\nB=1", "$(id)=1", "EMPTY="])
    assert "$(id)=1" not in script and "A\nB" not in script
    done = subprocess.run(["sh", "-c", '. /dev/stdin; printf "%s|%s|%s" "$V" "$PATH" "${EMPTY-unset}"'],
                          input=script, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout == f"{value}|/x:/y|", done
    kept = subprocess.run(["sh", "-c", '. /dev/stdin; printf "%s" "$V"'], input=script, capture_output=True,
                          text=True, env={"V": "the job's"})
    assert kept.stdout == "the job's"                                # as Apptainer's own: ${V:-value}

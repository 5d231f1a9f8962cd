"""The cluster image store: each registry image once for the whole cluster, as a read-only
squashfs on a filesystem every node sees, written only by the image service's account.

Layout under the store's root (``images.store``; the service account's, mode 0755)::

    images/<id>.sqfs        the image's root filesystem, read-only (0444); <id> is the hex of the
                            image's config digest (its image id: what the content is)
    images/<id>.apptainer.sqfs
                            the same files as a gzip squashfs with the image's ENV in
                            /.singularity.d/env (container.cluster_store.apptainer_form): the
                            form Apptainer starts as it is (before 1.4 it reads no zstd)
    images/<id>.json        what the service knows of it: size, when, the references that led to it
    refs/<key>.json         a reference (docker.io/library/ubuntu:22.04) the service resolved at the
                            registry itself: its manifest digest, the image id, when; <key> is the
                            sha256 of the reference
    locks/<key>.lock        the service instance publishing that reference now (host, pid); its
                            mtime is kept fresh while it works -- an old one is a killed publisher's
    failed/<key>.json       the last failure for a reference, which waiting ranks report
    staging/                what is being written (never read by a rank)
    uses/                   1733, like /tmp: one file per user, node and image, ``<id>.<uid>.<host>``,
                            the user's own (its mtime: the last use) -- what ``gc`` keeps and
                            ``tether images ls`` shows; nothing in it decides what a rank runs

Who may change what a rank runs: only the service account -- every file a rank reads is checked
to be a regular file of that account, not writable by anyone else, reached without a symlink, in
directories only it (or root) can change. The account publishes only what it fetched itself
from the registry without credentials (a public image), with the registry's manifest and blob
digests checked, so a user can neither plant an image nor make another user's reference name
different content. See SECURITY.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import threading
import time
from typing import Mapping, NamedTuple

from ..system.files import UntrustedPath, open_trusted_file, trusted_directory, write_atomic

IMAGES, REFS, LOCKS, FAILED, STAGING, USES = "images", "refs", "locks", "failed", "staging", "uses"
FETCHES = "fetches"        # the service's count of the fetches each uid asked for (fetches_per_hour)
SQUASHFS_MAGIC = b"hsqs"
SQUASHFS_GZIP = 1          # the superblock's compressor id (zstd is 6)
APPTAINER_FORM = ".apptainer.sqfs"
HEARTBEAT = 5.0            # how often a publisher touches its lock
STALE_AFTER = 60.0         # a lock untouched this long is a dead publisher's
ID_LENGTH = 64


class StoreError(Exception):
    """The store cannot be used as asked (the message says why, for the user or the admin)."""


class PrivateImage(StoreError):
    """The reference needs credentials: never in the store, the user's own pull."""


class Published(NamedTuple):
    """A reference the store can start: the squashfs and what it is."""
    reference: str
    image_id: str
    manifest: str
    path: str
    resolved: float
    config: dict          # the image's env, entrypoint, cmd, workdir (what --rootfs does not know)


class ImageInfo(NamedTuple):
    """One image of the store, for ``tether images ls``."""
    image_id: str
    size: int
    created: float
    references: tuple[str, ...]
    last_used: float
    users: tuple[int, ...]


def reference_key(reference: str) -> str:
    """The file name part for ``reference``: its sha256 (a reference has '/' and ':')."""
    return hashlib.sha256(reference.encode()).hexdigest()


def valid_id(image_id: str) -> bool:
    return len(image_id) == ID_LENGTH and all(c in "0123456789abcdef" for c in image_id)


def squashfs_intact(fd: int, compression: int | None = None) -> str | None:
    """Why the squashfs open at ``fd`` is not whole (None: its superblock says it is): the magic,
    and the size its superblock gives (bytes_used) against the file's -- a truncated or
    overwritten file is caught without reading the image; with ``compression``, its compressor."""
    head = os.pread(fd, 96, 0)
    if len(head) < 96 or head[:4] != SQUASHFS_MAGIC:
        return "not a squashfs image"
    bytes_used = struct.unpack_from("<Q", head, 40)[0]
    if compression is not None and struct.unpack_from("<H", head, 20)[0] != compression:
        return f"not compressed with compressor {compression} (the squashfs superblock's id)"
    if bytes_used > os.fstat(fd).st_size:
        return f"truncated ({os.fstat(fd).st_size} of {bytes_used} bytes)"
    return None


def _place(staged: str, target: str, compression: int | None, what: str) -> None:
    """Move the squashfs ``staged`` into place at ``target`` once it is whole and on disk, read-only
    (an image there already -- the same content -- is kept and ``staged`` dropped)."""
    fd = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        broken = squashfs_intact(fd, compression)
        if broken:
            raise StoreError(f"{what} is {broken}")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(staged, 0o444)
    if os.path.exists(target):
        os.unlink(staged)
    else:
        os.rename(staged, target)


class ImageStore:
    """The store at ``root``, whose files belong to ``owner`` (the service account's uid)."""

    def __init__(self, root: str, owner: int):
        self.root = root
        self.owner = owner

    @classmethod
    def configured(cls, settings: Mapping | None) -> "ImageStore | None":
        """The store ``container.cluster_store`` names (None: none is configured); StoreError when
        its account does not exist here or is root's (the store and its service need their own)."""
        settings = settings or {}
        if not settings.get("root"):
            return None
        import pwd

        account = settings.get("account") or "tether-images"
        try:
            owner = pwd.getpwnam(account).pw_uid
        except KeyError:
            raise StoreError(f"the cluster image store's account {account} does not exist here") from None
        if owner == 0:
            raise StoreError("container.cluster_store.account is root's: the store and its service need an account "
                             "of their own (never root)")
        return cls(settings["root"], owner)

    # ---- reading, as any user ----

    def _dir(self, name: str) -> str:
        try:
            return os.fspath(trusted_directory(os.path.join(self.root, name), self.owner,
                                               f"the cluster image store's {name} directory"))
        except FileNotFoundError:
            raise StoreError(f"the cluster image store {self.root} has no {name} directory: is it set up "
                             f"(tether images setup)?") from None
        except UntrustedPath as exc:
            raise StoreError(f"the cluster image store cannot be trusted: {exc}") from None

    def _open(self, path: str, what: str) -> int | None:
        """An fd of the store's file ``path`` when it is the account's own (see the module
        docstring); None when it does not exist; StoreError when it cannot be trusted."""
        try:
            return open_trusted_file(path, os.O_RDONLY, self.owner, what)
        except FileNotFoundError:
            return None
        except UntrustedPath as exc:
            raise StoreError(f"the cluster image store cannot be trusted: {exc}") from None

    def _read_json(self, directory: str, name: str) -> dict | None:
        path = os.path.join(self._dir(directory), name)
        fd = self._open(path, "a cluster image store record")
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(1 << 20)
        try:
            value = json.loads(data)
        except ValueError:
            raise StoreError(f"the cluster image store's record {path} is not JSON (a publisher was "
                             f"interrupted? tether images rm)") from None
        if not isinstance(value, dict):
            raise StoreError(f"the cluster image store's record {path} is not a mapping")
        return value

    def lookup(self, reference: str, *, max_age: float | None) -> Published | None:
        """The published image of ``reference`` when the service resolved it at most ``max_age``
        seconds ago (None: however long ago) and its squashfs is whole; else None."""
        record = self._read_json(REFS, f"{reference_key(reference)}.json")
        if not record or record.get("reference") != reference:
            return None
        image_id, resolved = str(record.get("id", "")), float(record.get("resolved", 0))
        if not valid_id(image_id) or (max_age is not None and time.time() - resolved > max_age):
            return None
        path = self.image_path(image_id)
        fd = self._open(path, "a cluster store image")
        if fd is None:
            return None
        try:
            broken = squashfs_intact(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if not broken and record.get("size") not in (None, size):
            broken = f"{size} bytes, not the {record.get('size')} it was published with"
        if broken:
            raise StoreError(f"the cluster store's image of {reference} ({path}) is {broken}: an admin "
                             f"removes it with `tether images rm {image_id[:12]}` and the next rank fetches it again")
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        return Published(reference, image_id, str(record.get("manifest", "")), path, resolved, config)

    def image_path(self, image_id: str) -> str:
        if not valid_id(image_id):
            raise StoreError(f"{image_id!r} is not an image id")
        return os.path.join(self._dir(IMAGES), f"{image_id}.sqfs")

    def apptainer_form(self, found: Published) -> str | None:
        """The Apptainer form of the published image ``found`` (a gzip squashfs; see the module
        docstring); None when the store has none (published before apptainer_form, or with it
        off); StoreError when it cannot be trusted or is damaged."""
        path = self.form_path(found.image_id)
        fd = self._open(path, "a cluster store image")
        if fd is None:
            return None
        try:
            broken = squashfs_intact(fd, SQUASHFS_GZIP)
        finally:
            os.close(fd)
        if broken:
            raise StoreError(f"the cluster store's Apptainer image of {found.reference} ({path}) is {broken}: an "
                             f"admin removes it with `tether images rm {found.image_id[:12]}` and the next rank "
                             f"fetches it again")
        return path

    def form_path(self, image_id: str) -> str:
        return self.image_path(image_id)[:-len(".sqfs")] + APPTAINER_FORM

    def failure(self, reference: str, since: float) -> str | None:
        """The publisher's error for ``reference`` recorded after ``since`` (None: none)."""
        record = self._read_json(FAILED, f"{reference_key(reference)}.json")
        if (record and record.get("reference") == reference and float(record.get("time", 0)) >= since
                and not record.get("private")):
            return str(record.get("error", "failed"))[:2000]
        return None

    def private(self, reference: str, max_age: float | None) -> str | None:
        """Why ``reference`` is a private image, when the service found so at most ``max_age``
        seconds ago (None: it did not)."""
        record = self._read_json(FAILED, f"{reference_key(reference)}.json")
        if (record and record.get("reference") == reference and record.get("private")
                and (max_age is None or time.time() - float(record.get("time", 0)) <= max_age)):
            return str(record.get("error", "it needs credentials"))[:2000]
        return None

    def has_image(self, image_id: str) -> bool:
        return os.path.exists(self.image_path(image_id))

    def publisher(self, reference: str) -> str | None:
        """Who publishes ``reference`` now ('host pid'), None when nobody does (or a dead one did)."""
        path = os.path.join(self._dir(LOCKS), f"{reference_key(reference)}.lock")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if st.st_uid != self.owner or not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime > STALE_AFTER:
            return None
        try:
            with os.fdopen(open_trusted_file(path, os.O_RDONLY, self.owner, "a publisher's lock"), "rb") as f:
                who = json.loads(f.read(4096))
            return f"{who.get('host')} pid {who.get('pid')}"
        except (OSError, ValueError, UntrustedPath):
            return "another node"

    def note_use(self, image_id: str) -> None:
        """Record that this user starts ``image_id`` on this node now (best effort: the mtime of
        the user's own file in uses/, what gc and ls read)."""
        if not valid_id(image_id):
            return
        path = os.path.join(self.root, USES, f"{image_id}.{os.getuid()}.{socket.gethostname()}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            try:
                if os.fstat(fd).st_uid == os.getuid():
                    os.utime(fd)
            finally:
                os.close(fd)
        except OSError:
            pass

    # ---- the service account's ----

    def setup(self) -> None:
        """Make the store's directories (as the service account; the root must be its own)."""
        root = trusted_directory(self.root, self.owner, "the cluster image store", create=True, mode=0o755)
        # 0711: a rank opens what its own reference names; nobody lists what others use or tried
        for name in (IMAGES, REFS, LOCKS, FAILED):
            made = trusted_directory(root / name, self.owner, f"the store's {name} directory", create=True, mode=0o711)
            os.chmod(made, 0o711)
        trusted_directory(root / STAGING, self.owner, "the store's staging directory", create=True, mode=0o700)
        uses = root / USES
        try:
            os.mkdir(uses, 0o1733)
        except FileExistsError:
            pass
        st = os.lstat(uses)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != self.owner:
            raise StoreError(f"{uses} is not the store account's directory")
        os.chmod(uses, 0o1733)

    def staging_path(self, what: str) -> str:
        return os.path.join(self._dir(STAGING),
                            f"{what}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.partial")

    def lock(self, reference: str) -> "PublishLock":
        return PublishLock(os.path.join(self._dir(LOCKS), f"{reference_key(reference)}.lock"))

    def place_form(self, image_id: str, staged: str) -> str:
        """Move the whole Apptainer form ``staged`` (in staging) into place for ``image_id``, whose
        squashfs is in place (kept when one is there already); its path."""
        target = self.form_path(image_id)
        _place(staged, target, SQUASHFS_GZIP, f"the Apptainer image made of {image_id[:12]}")
        return target

    def place_image(self, image_id: str, staged: str, reference: str) -> None:
        """Move the whole squashfs ``staged`` (in staging) into place as ``image_id``, no reference
        naming it yet (``publish`` does that)."""
        if not valid_id(image_id):
            raise StoreError(f"{image_id!r} is not an image id")
        _place(staged, os.path.join(self._dir(IMAGES), f"{image_id}.sqfs"), None, f"the image made for {reference}")

    def publish(self, reference: str, manifest: str, image_id: str, squashfs: str | None,
                user: int | None, *, config: dict | None = None) -> Published:
        """Move the whole squashfs ``squashfs`` (in staging) into place as ``image_id`` and point
        ``reference`` at it: the image first (a rename), then its record, then the reference's --
        a reader sees the reference only once everything it names is in place. An image already
        there (another reference to the same content; ``squashfs`` None) is kept and
        ``squashfs`` dropped."""
        if not valid_id(image_id):
            raise StoreError(f"{image_id!r} is not an image id")
        target = os.path.join(self._dir(IMAGES), f"{image_id}.sqfs")
        if squashfs is not None:
            self.place_image(image_id, squashfs, reference)
        elif not os.path.exists(target):
            raise StoreError(f"the store has no image {image_id} for {reference}")
        size = os.stat(target).st_size
        now = time.time()
        meta = self._read_json(IMAGES, f"{image_id}.json") or {"id": image_id, "size": size, "created": now,
                                                                "references": [], "first_user": user}
        if reference not in meta["references"]:
            meta["references"] = [*meta["references"], reference][-32:]
        self._write_json(IMAGES, f"{image_id}.json", meta)
        record = {"reference": reference, "manifest": manifest, "id": image_id, "resolved": now, "size": size,
                  "config": config or {}}
        self._write_json(REFS, f"{reference_key(reference)}.json", record)
        try:
            os.unlink(os.path.join(self._dir(FAILED), f"{reference_key(reference)}.json"))
        except FileNotFoundError:
            pass
        return Published(reference, image_id, manifest, target, now, config or {})

    def refresh(self, reference: str) -> None:
        """The registry still names what the store has for ``reference``: resolved now."""
        record = self._read_json(REFS, f"{reference_key(reference)}.json")
        if record:
            record["resolved"] = time.time()
            self._write_json(REFS, f"{reference_key(reference)}.json", record)

    def charge_fetch(self, uid: int | None, per_hour: int, *, now: float | None = None) -> int | None:
        """Count one fetch asked by ``uid`` (the service's, as the account): None when it is within
        ``per_hour`` fetches in the last hour across the cluster (counted), else how many that
        uid asked for in that hour (not counted). ``per_hour`` 0: no limit. Any local user can ask
        for any public image; this bounds what one can make the store fetch (disk, registry)."""
        import fcntl

        if uid is None or per_hour <= 0:
            return None
        now = time.time() if now is None else now
        try:
            where = trusted_directory(os.path.join(self.root, FETCHES), self.owner, "the store's fetches directory",
                                      create=True, mode=0o700)
            fd = os.open(os.path.join(where, str(int(uid))), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except (OSError, UntrustedPath):
            return None                  # not counted (said by tether doctor's store check), never refused for it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data, chunk = b"", os.pread(fd, 1 << 20, 0)
            while chunk:                 # the whole count: at most per_hour lines, kept short below
                data += chunk
                chunk = os.pread(fd, 1 << 20, len(data))
            try:
                times = [float(t) for t in data.split()]
            except ValueError:
                times = []
            recent = [t for t in times if now - 3600 < t <= now + CLOCK_SKEW]
            if len(recent) >= per_hour:
                return len(recent)
            text = "".join(f"{t:.3f}\n" for t in [*recent, now]).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
            return None
        finally:
            os.close(fd)

    def record_failure(self, reference: str, error: str, *, private: bool = False) -> None:
        self._write_json(FAILED, f"{reference_key(reference)}.json",
                         {"reference": reference, "error": error[:2000], "time": time.time(), "private": private})

    def record_private(self, reference: str, why: str) -> None:
        self.record_failure(reference, why, private=True)

    def _write_json(self, directory: str, name: str, value: dict) -> None:
        write_atomic(os.path.join(self._dir(directory), name), json.dumps(value, sort_keys=True), 0o644,
                     durable=True)

    # ---- the admin's ----

    def images(self) -> list[ImageInfo]:
        """Every published image, with its last use and users (uses/)."""
        uses: dict[str, tuple[float, set[int]]] = {}
        now = time.time()
        try:
            entries = list(os.scandir(os.path.join(self.root, USES)))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            image_id, _, rest = entry.name.partition(".")
            uid_text, _, _host = rest.partition(".")
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            # a user's file names only that user: one who made another's name is not counted
            if not valid_id(image_id) or not uid_text.isdigit() or st.st_uid != int(uid_text):
                continue
            last, users = uses.get(image_id, (0.0, set()))
            # a user sets their file's times as they like: never later than now (gc's window)
            uses[image_id] = (max(last, min(st.st_mtime, now)), users | {st.st_uid})
        out = []
        for entry in sorted(os.scandir(self._dir(IMAGES)), key=lambda e: e.name):
            if not entry.name.endswith(".sqfs") or not valid_id(entry.name[:-5]):
                continue
            image_id = entry.name[:-5]
            meta = self._read_json(IMAGES, f"{image_id}.json") or {}
            st = entry.stat(follow_symlinks=False)
            size = st.st_size
            try:
                size += os.lstat(os.path.join(entry.path[:-len(".sqfs")] + APPTAINER_FORM)).st_size
            except FileNotFoundError:
                pass
            created = float(meta.get("created", st.st_mtime))
            last, users = uses.get(image_id, (0.0, set()))
            out.append(ImageInfo(image_id, size, created, tuple(meta.get("references", ())),
                                 max(last, created), tuple(sorted(users))))
        return out

    def remove(self, image_id: str) -> list[str]:
        """Take ``image_id`` out of the store: the references to it first (no new rank finds it),
        then the image (a rank that has it mounted keeps its open file). Returns what went."""
        gone = []
        for entry in os.scandir(self._dir(REFS)):
            if entry.name.endswith(".json"):
                record = self._read_json(REFS, entry.name) or {}
                if record.get("id") == image_id:
                    os.unlink(entry.path)
                    gone.append(str(record.get("reference")))
        for suffix in (".sqfs", APPTAINER_FORM, ".json"):
            try:
                os.unlink(os.path.join(self._dir(IMAGES), image_id + suffix))
            except FileNotFoundError:
                pass
        for entry in os.scandir(os.path.join(self.root, USES)):
            if entry.name.startswith(image_id + "."):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        return gone

    def gc(self, max_bytes: int, keep_seconds: float) -> list[ImageInfo]:
        """Remove the least recently used images until the store holds at most ``max_bytes``,
        never one used in the last ``keep_seconds`` (a running job's next steps need it); and
        what killed publishers left in staging. Returns what was removed."""
        now = time.time()
        for entry in os.scandir(self._dir(STAGING)):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER:
                    os.unlink(entry.path)
            except OSError:
                pass
        for entry in os.scandir(self._dir(IMAGES)):
            # a form whose image went (rm or gc while it was being made): nothing names it
            if entry.name.endswith(APPTAINER_FORM) and not os.path.exists(
                    entry.path[:-len(APPTAINER_FORM)] + ".sqfs"):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        images = sorted(self.images(), key=lambda i: i.last_used)
        total = sum(i.size for i in images)
        removed = []
        for info in images:
            if total <= max_bytes:
                break
            if now - info.last_used < keep_seconds:
                continue
            self.remove(info.image_id)
            total -= info.size
            removed.append(info)
        return removed


class PublishLock:
    """One publisher per reference across the cluster: a file made with O_EXCL on the shared
    filesystem (NFS too), kept fresh by a thread while held; a lock untouched for STALE_AFTER
    seconds is a killed publisher's and is taken over."""

    def __init__(self, path: str):
        self.path = path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.token = os.urandom(16).hex()      # whose the lock file is: a takeover's is another's

    def _ours(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read(4096)).get("token") == self.token
        except (OSError, ValueError, AttributeError):
            return False

    def try_acquire(self) -> bool:
        data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                           "token": self.token}).encode()
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                if not self._break_stale():
                    return False
                continue
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            self._thread = threading.Thread(target=self._beat, daemon=True, name="publish-lock")
            self._thread.start()
            return True
        return False

    def _break_stale(self) -> bool:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return True
        if time.time() - st.st_mtime <= STALE_AFTER:
            return False
        # the dead publisher's file goes under a name of ours first: of two that found it stale,
        # only one renames it, and neither removes a lock someone took meanwhile
        aside = f"{self.path}.stale.{socket.gethostname()}.{os.getpid()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True
        try:
            if time.time() - os.lstat(aside).st_mtime <= STALE_AFTER:      # not the stale one after all
                try:
                    os.link(aside, self.path)
                except FileExistsError:
                    pass
                return False
        finally:
            try:
                os.unlink(aside)
            except FileNotFoundError:
                pass
        return True

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            if not self._ours():           # taken over (we were thought dead): never keep another's fresh
                return
            try:
                os.utime(self.path)
            except OSError:
                pass                       # a passing NFS error: the next beat tries again

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._ours():                   # never the lock of whoever took over
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "PublishLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class PublisherGone(StoreError):
    """Nobody publishes the reference any more and nothing was published: ask the service again."""


class FetchFailed(StoreError):
    """The publisher's fetch of the reference failed (its words): the user's own pull may not."""


CLOCK_SKEW = 30.0          # the publisher's clock is another node's


def wait_published(store: ImageStore, reference: str, *, since: float, timeout: float,
                   say=lambda text: None, interval: float = 0.5, gone_after: float = 3.0) -> Published:
    """Wait for the service to publish ``reference`` (after ``since``), saying once who does it;
    FetchFailed with the publisher's error when it failed; StoreError after ``timeout`` seconds;
    PublisherGone when no publisher holds it for ``gone_after`` seconds (killed: ask again)."""
    said = None
    deadline = time.monotonic() + timeout
    nobody = None
    while True:
        found = store.lookup(reference, max_age=None)
        if found and found.resolved >= since - CLOCK_SKEW:
            return found
        error = store.failure(reference, since)
        if error:
            raise FetchFailed(error)
        private = store.private(reference, None)
        if private and store.private(reference, time.time() - since + 1):
            raise PrivateImage(private)
        who = store.publisher(reference)
        if who and who != said:
            say(f"waiting for {reference}: the cluster image store's service on {who} is fetching it")
            said = who
        if who:
            nobody = None
        elif nobody is None:
            nobody = time.monotonic()
        elif time.monotonic() - nobody > gone_after:
            raise PublisherGone(f"nobody fetches {reference} for the cluster image store any more")
        if time.monotonic() > deadline:
            raise StoreError(f"{reference} was not published in the cluster image store within {timeout:.0f} s")
        time.sleep(interval)


__all__ = ["FetchFailed", "ImageStore", "ImageInfo", "PrivateImage", "Published", "PublisherGone", "PublishLock",
           "StoreError",
           "reference_key",
           "squashfs_intact", "wait_published"]

"""Runtime adapters: one module per runtime, found by name (adding a runtime = adding a file here,
a ``Runtime`` subclass named ``ADAPTER``, and its name in the config's runtime list).

An adapter turns a LaunchSpec into a ``Launch``: the runtime's argv and environment, commands to
run before it (image import, container creation) and after it (removal), and whether tether execs
it in place or supervises it (see tether.container.launch).
"""

from __future__ import annotations

import os
import stat
import sys
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ...hooks.imageref import ImageRef, ImageRefError, parse_image
from ...hooks.layout import user_dir_base
from ..environment import DEFAULT_MODE, overrides, passed_from_host
from ...hooks.records import dataclass
from ..spec import CONTAINER_WORKDIR, LaunchError, check_reachable, sha256_hex, value_hash

if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..spec import LaunchSpec



# --container-entrypoint: the job's variables the entrypoint does not start with
# (environment.entrypoint_split), as one file in the rank's work directory that the shell between
# the entrypoint and the command sources -- each line sets one variable where it is still unset
# (a single-quoted value: any bytes but NUL, nothing expanded; no other program needed) -- and
# removes. An entrypoint that became another user (gosu) cannot read it: said, as is a mount over
# the work directory. Arguments: the file as seen inside, then the rest.
LATER_FILE = ".tether-later.sh"
LATER_PART = ('if [ -r "$1" ]; then . "$1"; rm -f "$1" 2>/dev/null; else echo "tether: $1 is not readable in the '
              'container (a mount covers it, or the entrypoint became another user): the job\'s variables the '
              'entrypoint did not start with were not passed" >&2; fi; shift; ')


def later_script(later: Mapping[str, str]) -> str:
    """LATER_FILE's text: ``[ -n "${NAME+x}" ] || export NAME='VALUE'`` for each variable (names
    are variable names: environment.passed_from_host keeps no other)."""
    quoted = {name: "'" + value.replace("'", "'\\''") + "'" for name, value in later.items()}
    return "".join(f'[ -n "${{{name}+x}}" ] || export {name}={value}\n' for name, value in quoted.items())


def write_private(path: str | None, text: str, suffix: str, what: str) -> str:
    """``text`` in a file of mode 0600 at ``path`` (its directory made 0700; never through a
    symlink) or, by hand (None), in a new temporary file; the path. ``what`` names it in the error."""
    try:
        if path is None:
            import tempfile                   # only by hand: it costs a rank milliseconds

            fd, path = tempfile.mkstemp(prefix="tether-enroot-", suffix=suffix)
        else:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            # O_NONBLOCK: a FIFO the user put there (no reader) is ENXIO, not a rank waiting forever
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         0o600)
        # the bytes the job's environment had (os.environ decoded them so), whatever the locale;
        # text the locale cannot encode (a config's path, read as UTF-8) as UTF-8, as before
        try:
            data = os.fsencode(text)
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogateescape")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError as exc:            # something else where the file belongs (a symlink: ELOOP)
        raise LaunchError(f"cannot write {what} {path}: {exc.strerror}") from None
    return path


def later_values(rank_dir: str, later: Mapping[str, str]) -> str:
    """``later`` (see LATER_FILE) written in the rank's work directory; the file as the container
    sees it (LATER_PART's first argument)."""
    write_private(os.path.join(rank_dir, "work", LATER_FILE), later_script(later), "",
                  "file of the variables for after the entrypoint")
    return f"{CONTAINER_WORKDIR}/{LATER_FILE}"


@dataclass
class Launch:
    """What to run for one container launch."""

    argv: list[str] | None = None
    env: dict[str, str] | None = None
    supervise: bool = False       # fork and wait as a subreaper; False: exec in place
    # run first, in order, each must succeed: (argv, done[, label]). ``argv`` may be a
    # callable(env) tether runs itself. ``done`` is a path (the step is skipped when it
    # exists), an argv (skipped when that command succeeds: podman image exists), or a pair
    # (quick look, argv): the argv only when the quick look says no; ``label`` makes the step
    # say what it does on stderr (a pull: its progress)
    before: list[tuple] | tuple = ()
    lock: str | None = None       # file locked around ``before`` (ranks of a node share it)
    after: list | tuple = ()      # run when the runtime has exited: argvs, or callable(env) -> bool
    # the adapter and the container its ``remove`` takes away after an abnormal end (a signal,
    # the wrapper signalled, or the container's monitor killed)
    runtime: "Runtime | None" = None
    container: str | None = None
    # a process (by name) that owns the container's state: if it dies by a signal, the
    # container's exit status is lost and the container must be removed (podman: conmon)
    monitor: str | None = None
    # processes the runtime starts to outlive every container, as (the file it records the
    # pid in, the command names such a process has): the rank never waits for them -- they are
    # the runtime's, not the rank's -- and ends those it was left with, as the step's end
    # would (podman: its pause process)
    runtime_own: tuple = ()
    # a file that says which container to remove (``marker_data``) while the runtime runs,
    # removed once nothing is left to clean: if the step's end kills the cleanup too, slurmstepd
    # runs the launcher again in cleanup mode afterwards (tether.container.cleanup)
    marker: str | None = None
    marker_data: dict[str, str] | None = None
    # a file the runtime writes once it has created the container (podman's --cidfile): a run
    # that failed without it never started anything of the user's, so it may be tried again
    # after ``runtime.recover_state`` repaired the runtime's state
    created: str | None = None
    # file descriptors the runtime gets at other numbers ({from: to}, dup2'ed just before it
    # starts): the PMI-2 socket moves to 3, the first fd podman's --preserve-fds passes on
    fds: dict[int, int] | None = None
    # --container-save: (commands that write the container to ``partial``, partial, the final
    # path), run when the runtime has exited by itself; ``partial`` is renamed into place
    finish: tuple | None = None
    # the argv once ``before`` has run (what it made decides the rest: a named podman
    # container's ENTRYPOINT): callable(argv) -> argv
    prepare: object = None
    # the step's directory on this node (Slurm; on PBS each task's own): a step of ``before``
    # with a failure's wording (a fourth element) that failed leaves a record there, and the
    # step's other ranks on the node fail at once instead of trying again (pyxis: an image is
    # imported once per node and step)
    failures: str | None = None
    __hash__ = value_hash


@dataclass
class StoredImage:
    """One image in a user's store on this node (``tether images ls``)."""

    name: str = ""
    size: int = 0
    last_used: float = 0.0
    where: str = ""
    __hash__ = value_hash


def check_days(days: float) -> None:
    """``--older-than``: a number of days >= 0 (not negative, not NaN, not infinite)."""
    if not (0 <= days < float("inf")):
        raise LaunchError(f"--older-than {days:g}: give a number of days >= 0")



def env_name(name: str) -> bool:
    """A variable name as a shell word: ASCII letters, digits and '_', not starting with a digit
    (an image config's are anyone's to write; they reach shell scripts and env files)."""
    return name.isascii() and name.isidentifier()


class Runtime:
    """Base adapter. ``settings`` is the config's ``container.<runtime>`` section."""

    name = ""

    def __init__(self, settings: Mapping, *, image_root: str = "/var/cache/tether/images",
                 user_image_cache: str | None = None, environment: str = DEFAULT_MODE,
                 cluster_store: Mapping | None = None):
        self.binary = settings.get("binary") or self.name
        self.cluster_store = dict(cluster_store or {})     # the config's container.cluster_store
        self._image_store = None                            # image_store()'s
        self.environment = environment      # the config's container.environment (inherit | allowlist)
        self.args = list(settings.get("args") or ())
        self.runtime_env = dict(settings.get("env") or {})
        self.image_root = image_root
        self.user_image_cache = user_image_cache

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        raise NotImplementedError

    def remove(self, name: str, env: Mapping[str, str], *, new_session: bool = True, reap: bool = False) -> bool:
        """Take container ``name`` away after an abnormal end; False when something stayed (told to
        the user and the admin). Runtimes that leave nothing behind have nothing to do."""
        return True

    def not_started(self, code: int) -> str:
        """What the user is told when the runtime exited ``code`` before it made the container (its
        ``created`` file never appeared)."""
        return (f"{os.path.basename(self.binary)} exited {code} before it created the container; `{self.name} "
                f"info`, run as this user on this node, usually says why")

    def recover_state(self, env: Mapping[str, str], output: str | None = None, *, new_session: bool = True) -> bool:
        """After a failed runtime command (its ``output``, or None when the output went to the
        rank): repair the runtime's per-user state on this node if it is the known kind of stale,
        telling the user; True when the command is worth one more try. Most runtimes keep no
        such state."""
        return False

    # --- the user's images on this node (tether images) ---
    def pull(self, image: str, env: Mapping[str, str]) -> str:
        """Fetch ``image`` into this user's store on this node as a first container of it would,
        with the same progress lines and lock; what it is called there."""
        raise LaunchError(f"tether images pull: {self.name} keeps no image store of tether's")

    def stored(self, env: Mapping[str, str]) -> list[StoredImage]:
        """The images in this user's store on this node."""
        return []

    def prune(self, older_than_days: float, env: Mapping[str, str]) -> list[str]:
        """Remove this user's images on this node unused (podman: created) ``older_than_days``
        ago and not in use; what was removed."""
        return []

    # --- shared pieces ---
    def base_env(self, host_env: Mapping[str, str]) -> dict[str, str]:
        """The runtime process's own environment: the host's plus the configured runtime env."""
        env = dict(host_env)
        env.update(self.runtime_env)
        return env

    def container_env(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(host values passed, tether's own values) per the environment contract and its mode."""
        return passed_from_host(host_env, spec, self.environment), overrides(spec)

    @staticmethod
    def own_env_args(own: Mapping[str, str]) -> list[str]:
        """``--env NAME=VALUE`` for tether's own values (plain, short: safe on a command line)."""
        args = []
        for name, value in own.items():
            args += ["--env", f"{name}={value}"]
        return args

    @staticmethod
    def reference(image: str) -> ImageRef:
        """The parsed image reference (tether.hooks.imageref; checked already when the spec was made)."""
        try:
            return parse_image(image)
        except ImageRefError as exc:
            raise LaunchError(str(exc)) from None

    def is_remote(self, image: str) -> bool:
        """A registry image or a URI the runtime fetches, as opposed to a path on this node."""
        return self.reference(image).remote

    def image_store(self):
        """The configured cluster image store (ImageStore.configured: its account looked up once per
        adapter, not again for what a rank reads of the store after its lookup); StoreError as there."""
        if self._image_store is None:
            from ..imagestore import ImageStore

            self._image_store = ImageStore.configured(self.cluster_store)
        return self._image_store

    def cluster_store_image(self, name: str):
        """The cluster image store's image of registry image ``name`` (an imagestore.Published),
        asking this node's image service to fetch it when the store has it not (or resolved it too
        long ago) and waiting while another node's does; None when there is no cluster store, the
        image is private (it needs credentials: the user's own pull), the service cannot be reached
        or its fetch failed (said, with its words; the user's own pull). A LaunchError when the store
        cannot be trusted or its image is damaged."""
        import time

        from ..launch import progress

        settings = self.cluster_store
        if not settings.get("root"):
            return None
        from ..imageservice import ask
        from ..imagestore import FetchFailed, PrivateImage, PublisherGone, StoreError, wait_published

        try:
            store = self.image_store()
        except StoreError as exc:
            progress(f"{exc}: pulling {name} into your own store (tell an admin: tether doctor)")
            return None
        owner = store.owner
        resolve_every = float(settings.get("resolve_every", 900))
        wait = float(settings.get("wait_seconds", 3600))
        deadline = time.monotonic() + wait
        try:
            found = store.lookup(name, max_age=resolve_every)
            while found is None and not store.private(name, resolve_every):
                since = time.time()
                left = max(1.0, deadline - time.monotonic())
                try:
                    answer = ask(settings.get("socket") or "/run/tether-images/images.sock", name, say=progress,
                                 timeout=left, service_uid=owner)
                except (OSError, ValueError) as exc:
                    progress(f"the cluster image store's service cannot be reached on this node ({exc}): "
                             f"pulling {name} into your own store (tell an admin: tether doctor)")
                    return None
                if "published" in answer:
                    found = store.lookup(name, max_age=None)    # what the store holds, not what was said
                    if found is None:
                        raise LaunchError(f"the cluster image store's service said {name} is published, but the "
                                          f"store has it not (tell an admin)")
                elif "wait" in answer:
                    try:
                        found = wait_published(store, name, since=since, timeout=left, say=progress)
                    except PublisherGone:
                        if time.monotonic() > deadline:
                            raise
                        continue                                 # its publisher died: ask again
                elif "error" in answer:
                    # the service's anonymous fetch failed (the registry gone, its rate limit for
                    # anonymous pulls, a full disk): the user's own pull, with their own login,
                    # says for itself whether the image can be had
                    progress(f"the cluster image store could not fetch {name} ({str(answer['error'])[:500]}): "
                             f"pulling it into your own store")
                    return None
                elif "private" in answer:
                    return None
                elif "limit" in answer:
                    progress(f"{str(answer['limit'])[:300]}: pulling {name} into your own store")
                    return None
                else:                                            # busy, or an answer this launcher does not know
                    progress(f"the cluster image store's service is busy on this node: pulling {name} into your "
                             f"own store")
                    return None
        except PrivateImage:
            return None
        except FetchFailed as exc:        # another node's fetch failed: as the "error" answer above
            progress(f"the cluster image store could not fetch {name} ({str(exc)[:500]}): pulling it into your "
                     f"own store")
            return None
        except StoreError as exc:
            raise LaunchError(str(exc)) from None
        if found:
            store.note_use(found.image_id)
        return found

    @staticmethod
    def local_image(image: str) -> str:
        """A local image path that must exist (a clear error otherwise)."""
        if not image.startswith("/"):
            raise LaunchError(f"--container-image={image}: give an absolute path or a docker:// reference")
        check_reachable(image, f"--container-image={image}")
        if not os.access(image, os.R_OK | (os.X_OK if os.path.isdir(image) else 0)):
            raise LaunchError(f"--container-image={image}: permission denied (it is not readable by you)")
        return image

    def gpu_kind(self, spec: LaunchSpec) -> str | None:
        """'cuda' or 'rocm' when the rank has GPU slots, else None."""
        if not spec.gpus or spec.slot_type == "cpu":
            return None
        return "rocm" if spec.slot_type == "rocm" else "cuda"

    @staticmethod
    def home_mounts(spec: LaunchSpec, host_env: Mapping[str, str]) -> tuple:
        """``--container-mount-home``: the user's home directory at its own path, or at /root with
        --container-remap-root (root's home: as enroot's home hook mounts it) -- for runtimes that
        do not mount it themselves."""
        if not spec.mount_home:
            return ()
        from ..spec import Mount

        home = host_env.get("HOME") or ""
        target = "/root" if spec.remap_root else home.rstrip("/")
        # at its own path, a HOME of /tmp or /run would cover the rank's own directories there
        if not home.startswith("/") or target in ("", "/tmp", "/run", "/run/tether") or not os.path.isdir(home):
            raise LaunchError(f"--container-mount-home: HOME={home[:200]!r} is not a directory to mount on this node")
        return (Mount(home.rstrip("/") or "/", target),)

    def refuse_name(self, spec: LaunchSpec) -> None:
        if spec.name:
            raise LaunchError(f"--container-name: {self.name} keeps no container between steps (enroot and "
                              f"podman do)")


def own_directory(path: str, uid: int, what: str, *, private: bool) -> None:
    """Refuse ``path`` unless it is a real directory (not a symlink) of ``uid``; ``private``: and
    nobody else may enter it (made so when it is the user's own)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise LaunchError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise LaunchError(f"{what} {path} is not a directory of yours (uid {uid}): tether will not use a store "
                          f"another user could change; an admin removes it")
    if private and st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _user_dir(template: str, uid: int, what: str) -> None:
    """For a store whose ``{uid}`` is a whole path component: ``<base>/<uid>`` must be there, made by
    root for this user (slurmstepd or the PBS MoM hook, at the user's first container step on the
    node) in a base only root writes. A user cannot make it: nobody can take another's first."""
    base = user_dir_base(template)
    if base is None:
        return
    try:
        st = os.lstat(base)
    except OSError as exc:
        raise LaunchError(f"{what}: {base}: {exc.strerror} (root makes each user's directory there at their "
                          f"first container step on the node: plugstack.conf user_dirs=, `tether slurm install "
                          f"--write`)") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise LaunchError(f"{what}: {base} must be a directory of root's that group and others cannot write "
                          f"(each user's directory is made there as root); an admin fixes it")
    mine = f"{base}/{uid}"              # whose it is: store_directory's check from this one down
    if not os.path.lexists(mine):
        if uid == 0 and os.geteuid() == 0:
            os.mkdir(mine, 0o700)            # root's own (tether images pull as root)
            return
        raise LaunchError(f"{what}: {mine} does not exist: root makes it for you when your first container "
                          f"step starts on this node (tether's SPANK plugin, plugstack.conf user_dirs=; on PBS "
                          f"the MoM hook). Run a container step here first, or ask an admin")


def store_directory(template: str, uid: int, what: str = "podman store") -> str | None:
    """This user's store on this node from a ``container.<runtime>.store`` template (None: the
    runtime's own default). Made 0700 on first use; every directory from the first one named
    after the user down must be the user's own -- a store planted by another user (a symlink, a
    directory of theirs) would let them change the images this user runs. With ``{uid}`` as a whole
    component, the directory of that name is root's making for the user (``_user_dir``)."""
    if not template:
        return None
    path = template.replace("{uid}", str(uid)).rstrip("/")
    _user_dir(template, uid, what)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"image store {path} (container.*.store): cannot create it: {exc.strerror}") from None
    _check_store(template, path, uid, what, private=True)
    return path


def existing_store(template: str, uid: int, what: str = "podman store") -> str | None:
    """This user's store on this node when it exists, checked as ``store_directory`` checks it but
    never made or changed (``tether images ls`` and the like: root's too). None: there is none."""
    if not template:
        return None
    path = template.replace("{uid}", str(uid)).rstrip("/")
    if not os.path.lexists(path):
        return None
    _check_store(template, path, uid, what, private=False)
    return path


def _check_store(template: str, path: str, uid: int, what: str, *, private: bool) -> None:
    parts = path.split("/")
    first = template.split("{uid}", 1)[0].count("/")
    for end in range(first + 1, len(parts) + 1):
        own_directory("/".join(parts[:end]), uid, what, private=private and end == len(parts))


def adapter(name: str, settings: Mapping, **kw) -> Runtime:
    """The adapter for runtime ``name`` (imported on demand: a launch loads only its own runtime)."""
    if not name.isidentifier():
        raise LaunchError(f"unknown container runtime {name!r}")
    try:
        __import__(f"{__name__}.{name}")        # not importlib: it costs each rank's start-up
        module = sys.modules[f"{__name__}.{name}"]
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":     # the adapter is there, but something it needs is not
            raise LaunchError(f"the {name} runtime's adapter cannot be loaded: {exc} (an installation "
                              f"problem: tell an admin)") from None
        raise LaunchError(f"unknown container runtime {name!r}") from None
    return module.ADAPTER(settings, **kw)


def available() -> Sequence[str]:
    """Runtime names with an adapter module here."""
    here = os.path.dirname(__file__)
    return sorted(f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith("_"))


def mark_checked(marker: str) -> None:
    """Note that a tagged image was pulled or checked against its registry for this job on this node."""
    try:
        os.makedirs(os.path.dirname(marker), mode=0o700, exist_ok=True)
        # never through a link, never waiting on a FIFO (O_NONBLOCK: no reader is ENXIO)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600))
    except OSError:
        pass          # best effort: without it, the job's next rank here checks once more


def registry_unchecked(image: str, why: str) -> None:
    """Tell the rank that a tagged image could not be checked against its registry (``why``: the
    runtime's words) and that the copy in the user's store runs."""
    from ..launch import progress

    progress(f"could not check {image} against its registry ({why[:300]}); running the copy in your store on "
             f"this node")


def checked_marker(rank_dir: str, runtime: str, name: str) -> str:
    """Where a job notes, on a node, that it checked a tagged image ``name`` against its registry
    (the job's node directory: ``<job>/<node>/<runtime>/checked-<hash>``)."""
    return os.path.join(os.path.dirname(os.path.dirname(rank_dir)), runtime, "checked-" + sha256_hex(name)[:16])


def pmi_fd(host_env: Mapping[str, str]) -> int | None:
    """The task's PMI-2 descriptor (srun --mpi=pmi2's PMI_FD, the job's to set: a small number
    naming a descriptor open above 2), or None."""
    value = host_env.get("PMI_FD", "")
    if not (value.isascii() and value.isdigit() and len(value) <= 6 and int(value) > 2):
        return None
    try:
        os.fstat(int(value))
    except (OSError, OverflowError):
        return None
    return int(value)

"""Apptainer: ``apptainer exec``, exec'd in place (the starter becomes the rank; no daemon).

``--cleanenv`` drops the inherited host environment; the contract's host values and tether's own
enter as ``APPTAINERENV_<NAME>`` (``SINGULARITYENV_`` for Singularity): comma-safe (``--env`` splits
values on commas), known to every version (SingularityCE before 3.6 has no ``exec --env``), and
winning over the image's own values as on the other runtimes (without --cleanenv a def file's
%environment would win over an inherited host value, while docker ENV loses to it). docker:// and other remote sources are converted once into the image cache
(tether.container.images: the shared one, or the user's own), or started from the cluster image
store's Apptainer form as it is (container.cluster_store); a SIF, a squashfs file or a sandbox
directory runs as is.
"""

from __future__ import annotations

import os

from ..launch import progress
from ..spec import CONTAINER_BATCH_SCRIPT, LaunchError, Mount, mount_refusal
from . import Launch, Runtime

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

if TYPE_CHECKING:
    from typing import Mapping

    from ..spec import LaunchSpec


# Names <PREFIX>ENV_ cannot set (Apptainer internal/pkg/util/env/create.go: HOME is "not permitted";
# PREPEND_PATH / APPEND_PATH are read as changes to PATH)
NOT_BY_PREFIX = ("HOME", "PREPEND_PATH", "APPEND_PATH")
# What the runtime reads in its own (host-side) environment: kept there as well as passed in
HOST_SIDE = ("PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "TERM", "LANG", "LANGUAGE", "TZ", "SSL_CERT_FILE",
             "SSL_CERT_DIR", "http_proxy", "https_proxy", "no_proxy", "all_proxy", "ftp_proxy", "HTTP_PROXY",
             "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY")


# SingularityCE 3.4 (recorded: tests/fixtures/conformance/singularity-3.4-locale.json) leaves LANG=C
# under --cleanenv whatever SINGULARITYENV_LANG says, but takes every LC_* variable: the job's LANG
# goes in as each locale category the job does not set itself, so the locale is the job's
LOCALE_CATEGORIES = ("LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES", "LC_PAPER",
                     "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION")


def host_side(name: str) -> bool:
    return name in HOST_SIDE or name.startswith(("LC_", "XDG_"))


def pmix_mounts(host_env: Mapping[str, str]) -> list[Mount]:
    """srun --mpi=pmix: the PMIx server's directory (PMIX_SERVER_TMPDIR, its shared-memory stores)
    and the step's client directory, at their own paths (the PMIX_* variables name them and pass
    unchanged; the server is reached over TCP, the host's network). PMI-2 needs nothing: the
    runtime is exec'd in place, so the rank's PMI_FD stays open in the container."""
    server = host_env.get("PMIX_SERVER_TMPDIR", "").rstrip("/")
    if not server:
        return []
    from .podman import pmix_client_dir       # only MPI ranks pay for it

    paths = [p for p in (server, pmix_client_dir(host_env)) if p]
    return [Mount(p, p) for p in dict.fromkeys(paths)
            if p.startswith("/") and not any(c in p for c in ":, ") and os.path.isdir(p)]


class Apptainer(Runtime):
    name = "apptainer"
    env_prefix = "APPTAINERENV_"

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        self.refuse_name(spec)
        env = {k: v for k, v in self.base_env(host_env).items()
               if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
        passed, own = self.container_env(spec, host_env)
        refused = sorted(n for n in passed if n in NOT_BY_PREFIX)
        if refused:
            progress(f"not passed into the {self.name} container: {', '.join(refused)} ({self.env_prefix}HOME is "
                     f"refused by {self.name}, which sets HOME itself; {self.env_prefix}PREPEND_PATH and "
                     f"APPEND_PATH change PATH instead)")
        # <PREFIX>ENV_NAME=value sets NAME inside, with --cleanenv too, in every version (SingularityCE
        # before 3.6 has no `exec --env`: "Error: unknown flag: --env"), winning over the image's
        # %environment and docker ENV; tether's own values last. The host copy goes (the runtime does
        # not read it, and a large environment twice may not fit execve's limit), except what the
        # runtime itself reads on the host.
        if self.name == "singularity" and passed.get("LANG") and "LC_ALL" not in passed:
            for category in LOCALE_CATEGORIES:
                if category not in passed and category not in own:
                    env[self.env_prefix + category] = passed["LANG"]
        for name, value in {**passed, **own}.items():
            if name in NOT_BY_PREFIX:
                continue
            env[self.env_prefix + name] = value
            if name in passed and not host_side(name):
                env.pop(name, None)
        if spec.save:
            raise LaunchError(f"--container-save: {self.name} keeps no container to save (it runs the image "
                              f"itself); use podman or enroot, or build a new image with `{self.name} build`")
        if spec.unshare:    # refused at submit too, but a step inside an allocation meets only this
            raise LaunchError(f"--container-unshare: tether does not unshare namespaces with {self.name} yet "
                              f"(the container would run in the host's {', '.join(spec.unshare)}); use podman "
                              f"or enroot")
        refusal = mount_refusal(spec.mounts, self.name)
        if refusal:
            raise LaunchError(refusal)
        flagged = [m for m in spec.mounts if m.flags]
        if flagged:
            raise LaunchError(f"--container-mounts: {self.name} binds take ro or rw only, not "
                              f"{'+'.join(flagged[0].flags)} ({flagged[0].source})")
        # --container-entrypoint: `run` (the image's runscript: a docker image's ENTRYPOINT with the
        # command as its arguments); else `exec`, the command itself, as pyxis does by default
        argv = [self.binary, "run" if spec.entrypoint else "exec", *self.args, "--cleanenv"]
        if spec.mount_home is False:          # Apptainer/Singularity mount the home directory themselves
            argv.append("--no-home")
        if spec.remap_root:                   # root inside a user namespace (Apptainer's fakeroot)
            argv.append("--fakeroot")
        batch = [Mount(spec.batch_script, CONTAINER_BATCH_SCRIPT, True)] if spec.batch_script else []
        for mount in (*spec.rank_mounts(), *spec.mounts, *batch, *pmix_mounts(host_env)):
            argv += ["--bind", str(mount)]
        argv += ["--pwd", spec.workdir]
        gpu = self.gpu_kind(spec)
        if gpu == "cuda":
            argv.append("--nv")
        elif gpu == "rocm":
            self.require_version((3, 5), "--rocm")
            argv.append("--rocm")
        if spec.writable:
            argv.append("--writable-tmpfs")
        argv += [self.image_path(spec, env), *spec.command]
        return Launch(argv=argv, env=env, runtime=self)

    def cluster_image(self, spec: LaunchSpec) -> str | None:
        """The cluster image store's Apptainer form of the rank's registry image (a gzip squashfs
        Apptainer starts as it is: squashfuse, nothing converted or unpacked), None when the rank
        converts it as without the store: Singularity (SingularityCE 3 needs the image's own
        /.singularity.d actions), the image's entrypoint (its runscript), a ``user@`` reference,
        a store that has no Apptainer form of it (apptainer_form off when it was fetched, or the
        service could not make it)."""
        if self.name != "apptainer" or spec.entrypoint or not self.cluster_store.get("root") \
                or not self.cluster_store.get("apptainer_form", True):
            return None
        ref = self.reference(spec.image)
        if ref.kind != "registry" or ref.user:
            return None
        found = self.cluster_store_image(ref.qualified())
        if found is None:
            return None
        from ..imagestore import StoreError

        try:
            path = self.image_store().apptainer_form(found)
        except StoreError as exc:
            raise LaunchError(str(exc)) from None
        if path is None:
            progress(f"the cluster image store has no Apptainer image of {ref.qualified()} (fetched before "
                     f"apptainer_form was on, or it could not be made): converting it into the image cache")
        return path

    def require_version(self, minimum: tuple[int, int], flag: str) -> None:
        """Refuse, with one line naming the minimum, a runtime too old for ``flag`` (asked only when
        such a flag is needed: running ``--version`` costs every rank a process)."""
        if self.name != "singularity":            # Apptainer (1.0+) has everything tether uses
            return
        from ...system.proc import CommandError, run_command

        try:
            text = run_command([self.binary, "--version"], timeout=20).stdout
        except CommandError as exc:
            raise LaunchError(f"cannot ask {self.binary} for its version: {exc}") from None
        numbers = [int(n) for n in text.split()[-1].split("-")[0].split(".")[:2] if n.isdigit()]
        if len(numbers) == 2 and tuple(numbers) < minimum:
            raise LaunchError(f"{self.binary} {text.split()[-1]} has no {flag}: SingularityCE "
                              f"{minimum[0]}.{minimum[1]} or newer (or Apptainer) is needed for it")

    def image_cache(self, env: Mapping[str, str]):
        """The shared SIF cache and this user's own (tether.container.images)."""
        from ..images import ImageCache, user_cache_dir  # only remote images need the cache's imports

        user_dir = None
        if self.user_image_cache:
            user_dir = user_cache_dir(self.user_image_cache, os.getuid(), env.get("HOME"))
        return ImageCache(self.image_root, user_dir=user_dir)

    def image_path(self, spec: LaunchSpec, env: Mapping[str, str]) -> str:
        if not self.is_remote(spec.image):
            return self.local_image(spec.image)
        stored = self.cluster_image(spec)
        if stored:
            return stored
        # one spelling per image (ubuntu:22.04 = docker://docker.io/library/ubuntu:22.04): one conversion
        return self.image_cache(env).ensure(self.reference(spec.image).docker_uri(),
                                            build=[self.binary, "build", *self.args], env=env)

    def pull(self, image: str, env: Mapping[str, str]) -> str:
        """``tether images pull``: convert a remote image into the SIF cache (root: the shared one)."""
        if not self.is_remote(image):
            raise LaunchError(f"tether images pull: {image} is not a registry image or URI")
        return self.image_cache(env).ensure(self.reference(image).docker_uri(),
                                            build=[self.binary, "build", *self.args], env=self.base_env(env))

    def stored(self, env: Mapping[str, str]) -> list:
        from . import StoredImage

        return [StoredImage(name=i.source, size=i.size, last_used=i.last_used, where=i.path)
                for i in self.image_cache(env).entries()]

    def prune(self, older_than_days: float, env: Mapping[str, str]) -> list[str]:
        return self.image_cache(env).prune(older_than_days)


ADAPTER = Apptainer

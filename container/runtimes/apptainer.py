"""Apptainer: ``apptainer exec``, exec'd in place (the starter becomes the rank; no daemon).

``--cleanenv`` drops the inherited host environment; the contract's host values and tether's own
enter as ``APPTAINERENV_<NAME>`` (``SINGULARITYENV_`` for Singularity): comma-safe (``--env`` splits
values on commas), and known to every version (SingularityCE before 3.6 has no ``exec --env``). docker:// and other remote sources are converted once into the image cache
(tether.container.images: the shared one, or the user's own); a SIF, a squashfs file or a sandbox
directory runs as is.
"""

from __future__ import annotations

import os

from ..spec import LaunchError
from . import Launch, Runtime

TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

if TYPE_CHECKING:
    from typing import Mapping

    from ..spec import LaunchSpec


class Apptainer(Runtime):
    name = "apptainer"
    env_prefix = "APPTAINERENV_"

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        self.refuse_name(spec)
        env = {k: v for k, v in self.base_env(host_env).items()
               if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
        passed, own = self.container_env(spec, host_env)
        # <PREFIX>ENV_NAME=value sets NAME inside, with --cleanenv too, in every version (SingularityCE
        # before 3.6 has no `exec --env`: "Error: unknown flag: --env"); tether's own values last
        for name, value in {**passed, **own}.items():
            env[self.env_prefix + name] = value
        argv = [self.binary, "exec", *self.args, "--cleanenv"]
        for mount in (*spec.rank_mounts(), *spec.mounts):
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

    def image_path(self, spec: LaunchSpec, env: Mapping[str, str]) -> str:
        if not self.is_remote(spec.image):
            return self.local_image(spec.image)
        from ..images import ImageCache, user_cache_dir  # only remote images need the cache's imports

        user_dir = None
        if self.user_image_cache:
            user_dir = user_cache_dir(self.user_image_cache, os.getuid(), env.get("HOME"))
        # one spelling per image (ubuntu:22.04 = docker://docker.io/library/ubuntu:22.04): one conversion
        return ImageCache(self.image_root, user_dir=user_dir).ensure(
            self.reference(spec.image).docker_uri(), build=[self.binary, "build", *self.args], env=env)


ADAPTER = Apptainer

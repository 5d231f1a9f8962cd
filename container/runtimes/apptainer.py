"""Apptainer: ``apptainer exec``, exec'd in place (the starter becomes the rank; no daemon).

``--cleanenv`` drops the inherited host environment; the contract's host values enter as
``APPTAINERENV_<NAME>`` (comma-safe: ``--env`` splits its value on commas) and tether's own values
as ``--env NAME=VALUE``. docker:// and other remote sources are converted once into the image cache
(tether.container.images: the shared one, or the user's own); a SIF, a squashfs file or a sandbox
directory runs as is.
"""

from __future__ import annotations

import os

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
        for name, value in passed.items():
            env[self.env_prefix + name] = value
        argv = [self.binary, "exec", *self.args, "--cleanenv"]
        for name, value in own.items():
            argv += ["--env", f"{name}={value}"]
        for mount in (*spec.rank_mounts(), *spec.mounts):
            argv += ["--bind", str(mount)]
        argv += ["--pwd", spec.workdir]
        gpu = self.gpu_kind(spec)
        if gpu == "cuda":
            argv.append("--nv")
        elif gpu == "rocm":
            argv.append("--rocm")
        if spec.writable:
            argv.append("--writable-tmpfs")
        argv += [self.image_path(spec, env), *spec.command]
        return Launch(argv=argv, env=env)

    def image_path(self, spec: LaunchSpec, env: Mapping[str, str]) -> str:
        if not self.is_remote(spec.image):
            return self.local_image(spec.image)
        from ..images import ImageCache, user_cache_dir  # only remote images need the cache's imports

        user_dir = None
        if self.user_image_cache:
            user_dir = user_cache_dir(self.user_image_cache, os.getuid(), env.get("HOME"))
        return ImageCache(self.image_root, user_dir=user_dir).ensure(
            spec.image, build=[self.binary, "build", *self.args], env=env)


ADAPTER = Apptainer

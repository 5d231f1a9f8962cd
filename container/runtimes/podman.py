"""Podman: ``podman run``, supervised so the container stays inside the step.

conmon double-forks away from its caller; tether's wrapper is a child subreaper (see
tether.container.launch), so conmon and the container's processes stay descendants of the rank --
Slurm's process tracking, accounting and kill reach them. Host network and host PID namespace
(signals and process visibility as on the host, like Apptainer and Enroot); ``--userns=keep-id``
when not root, so files in the per-rank directories and mounts keep the user's ownership; a
rootfs directory runs read-only as it is (``--read-only --rootfs DIR``: a shared image is never
written), or with --container-writable, for a rootfs the user owns, through an overlay whose
changes are discarded (``--rootfs DIR:O``). Environment: not inherited; ``--env NAME`` copies the contract's host values from
podman's own environment (values never appear on the command line), ``--env NAME=VALUE`` sets
tether's own.
"""

from __future__ import annotations

import os
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ..spec import LaunchError
from . import Launch, Runtime

if TYPE_CHECKING:
    from typing import Mapping

    from ..spec import LaunchSpec


# Mount targets podman needs in a rootfs; it creates them itself only where the user may write.
ROOTFS_TARGETS = ("etc/passwd", "etc/group", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab",
                  "proc", "sys", "dev", "run", "tmp", "var/tmp")


def check_shared_rootfs(path: str) -> None:
    """A rootfs the user cannot write to (a shared, admin-owned image) must already hold podman's
    mount targets; say which are missing instead of podman's "permission denied"."""
    etc = os.path.join(path, "etc")
    if os.access(etc if os.path.isdir(etc) else path, os.W_OK):
        return
    missing = [t for t in ROOTFS_TARGETS if not os.path.lexists(os.path.join(path, t))]
    if missing:
        raise LaunchError(f"--container-image={path}: this shared rootfs lacks {', '.join('/' + m for m in missing)}; "
                          f"podman needs them as mount targets (an admin creates them: empty files in "
                          f"/etc, /etc/mtab a symlink to /proc/mounts, the others directories)")


# Where podman mounts a tmpfs in a --read-only container: mount targets below them can be created.
TMPFS_DIRS = ("/tmp/", "/run/", "/var/tmp/", "/dev/")


def check_mount_targets(path: str, mounts) -> None:
    """A read-only rootfs the user cannot write to gets no new mount points: each --container-mounts
    target must exist in it already (or lie on one of podman's tmpfs)."""
    if os.access(path, os.W_OK):
        return
    missing = [m.target for m in mounts
               if not m.target.startswith(TMPFS_DIRS) and not os.path.lexists(path + m.target)]
    if missing:
        raise LaunchError(f"--container-mounts: {', '.join(missing)} does not exist in the read-only image {path}; "
                          f"mount onto a directory the image has (e.g. /mnt), or add --container-writable")


def stdio_is_terminal() -> bool:
    """Is any of this process's stdin, stdout, stderr a terminal?"""
    return any(os.isatty(fd) for fd in (0, 1, 2))


class Podman(Runtime):
    name = "podman"

    def launch(self, spec: LaunchSpec, host_env: Mapping[str, str]) -> Launch:
        self.refuse_name(spec)
        env = self.base_env(host_env)
        if "TMPDIR" not in self.runtime_env:
            # rootless podman keeps its run state under $TMPDIR when XDG_RUNTIME_DIR is unset (as in
            # a Slurm task): not in the rank's own /tmp, which the container sees
            env.pop("TMPDIR", None)
        passed, own = self.container_env(spec, host_env)
        name = spec.instance
        argv = [self.binary, "run", *self.args, "--log-level=fatal", "--rm", "--name", name,
                "--label", f"tether.job={spec.job_id}", "--label", f"tether.step={spec.job_id}.{spec.step_id}",
                "--network=host", "--pid=host"]
        if not stdio_is_terminal():
            # the container gets the rank's own stdin/stdout/stderr, as a host rank does: no attach
            # through conmon (which lost a short rank's output once here, and does not pass stdin)
            # and no copy of all output in a log file under the user's home. podman refuses it on
            # a terminal (srun --pty): there the default attach stays.
            argv.append("--log-driver=passthrough")
        if os.getuid() != 0:
            argv.append("--userns=keep-id")
        if not spec.writable:
            argv.append("--read-only")
        argv += self.env_args(passed, own)
        for mount in (*spec.rank_mounts(), *spec.mounts):
            argv += ["--volume", str(mount)]
        argv += ["--workdir", spec.workdir]
        gpu = self.gpu_kind(spec)
        if gpu == "cuda":
            argv += ["--device", "nvidia.com/gpu=all"]
        elif gpu == "rocm":
            argv += ["--device", "/dev/kfd", "--device", "/dev/dri"]
        argv += self.image_args(spec.image, spec.writable, spec.mounts)
        argv += spec.command
        # After an abnormal end (a signal, the step cancelled) --rm may not have run: remove it. If
        # the step's end kills that too, slurmstepd runs it once the step is over (see ``marker``).
        cleanup = [self.binary, "rm", *self.global_args(), "--force", "--ignore", "--time", "0", name]
        marker = os.path.join(os.path.dirname(spec.rank_dir), f".cleanup-{spec.rank}") if spec.rank_dir else None
        return Launch(argv=argv, env=env, supervise=True, after_abnormal=[cleanup], marker=marker,
                      marker_env={k: env[k] for k in ("PATH", "HOME", "XDG_RUNTIME_DIR", *self.runtime_env)
                                  if k in env})

    def global_args(self) -> list[str]:
        """The configured args that are podman global options (e.g. --runtime runc), for ``rm``."""
        out, args = [], list(self.args)
        while args:
            arg = args.pop(0)
            if arg in ("--runtime", "--root", "--runroot", "--storage-driver", "--cgroup-manager") and args:
                out += [arg, args.pop(0)]
            elif arg.split("=", 1)[0] in ("--runtime", "--root", "--runroot", "--storage-driver",
                                           "--cgroup-manager"):
                out.append(arg)
        return out

    def image_args(self, image: str, writable: bool, mounts=()) -> list[str]:
        if self.is_remote(image):
            return [image]
        path = self.local_image(image)
        if os.path.isdir(path):
            check_shared_rootfs(path)
            if not writable:
                check_mount_targets(path, mounts)
            elif not os.access(path, os.W_OK):
                raise LaunchError(f"--container-writable: podman cannot overlay the shared image {path}, which "
                                  f"you cannot write to (rootless overlays need a rootfs you own); drop "
                                  f"--container-writable, or use a registry image")
            # Read-only: the directory itself, never written (keep-id bind-mounts its own passwd).
            # Writable (a rootfs the user owns): through an overlay whose changes are discarded
            # (podman 4.3 leaves the overlay's empty work directories in its run root afterwards).
            return ["--rootfs", f"{path}:O" if writable else path]
        raise LaunchError(f"--container-image={image}: podman runs a rootfs directory or a registry "
                          f"image (docker://...), not a file")


ADAPTER = Podman

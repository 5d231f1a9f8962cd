"""What every host needs, whatever the scheduler: tether's container launcher, job_storage_root and
the Apptainer image cache. ``tether slurm install --write`` and ``tether pbs install --apply`` use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..container.rank_launcher import build_fd_helper, build_rank_launcher
from ..container.runtimes.enroot import FD_HELPER
from ..container.run import LAUNCHER_NAME, PYTHON_LAUNCHER_NAME, launcher_text
from ..hooks.config import Config
from ..hooks.configfile import DEFAULT_CONFIG_PATH
from ..system.files import create_dir, write_atomic
from ..system.toolchain import BuildError

__all__ = ["LAUNCHER_NAME", "install_launcher", "ensure_image_root", "ensure_storage_root"]


def install_launcher(plugin_dir: Path, config: Config, *, installed_dir: Path | None = None,
                     paths: Sequence[str] | None = None, bake_identity: bool = True, log=print) -> Path:
    """Write the container launcher next to the SPANK plugin: the Python one (tether-run-py, see
    tether.container.run) and the C rank launcher in front of it (tether-run, see
    tether.container.rank_launcher), both with a new inode (running tasks keep the old one), and
    tether-fd-receive beside them (tether.container.runtimes.enroot.FD_HELPER).
    For a package (tools/deb.py): ``installed_dir`` is where the two will be on the hosts (default
    ``plugin_dir``), ``paths`` the Python launcher's sys.path there, and without ``bake_identity``
    they are built as for a host with no config file."""
    source = None if config.source.startswith("<") else config.source
    settings = config.data["container"]
    python = plugin_dir / PYTHON_LAUNCHER_NAME
    write_atomic(python, launcher_text(source or DEFAULT_CONFIG_PATH, settings, paths=paths,
                                       bake_identity=bake_identity), 0o755)
    try:
        build_fd_helper(plugin_dir / FD_HELPER)
    except BuildError as exc:        # without it, an enroot rank of srun --mpi=pmi2 says what it lacks
        log(f"warning: {FD_HELPER} (PMI_FD into enroot containers) not built: {exc}")
    return build_rank_launcher(plugin_dir / LAUNCHER_NAME, source or DEFAULT_CONFIG_PATH, settings,
                               str(Path(installed_dir or plugin_dir) / PYTHON_LAUNCHER_NAME),
                               bake_identity=bake_identity)


def ensure_image_root(path: Path, log=print) -> None:
    """The shared Apptainer image cache (root-owned 0755: only root converts into it)."""
    if create_dir(path, 0o755):
        log(f"created apptainer_image_root {path} (root, 0755)")


def ensure_storage_root(path: Path, log=print) -> None:
    """Create job_storage_root (root-owned, 0755) or check an existing one: the SPANK plugin creates
    per-job directories there as root and refuses a root others can write to."""
    if create_dir(path, 0o755):
        log(f"created job_storage_root {path} (root, 0755); it must exist on every compute node")
        return
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != 0 or st.st_mode & 0o022:
        raise BuildError(f"job_storage_root {path} must be a root-owned directory that group and "
                         f"others cannot write to (mode 0755)")

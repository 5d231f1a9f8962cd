"""``tether slurm build`` and ``tether slurm install``: the one path from source to a loaded plugin.

build   compiles spank_tether.so and job_submit_tether.so against the installed Slurm headers and
        this Python (stamped with the exact Slurm version, in build.json next to them);
install puts both into Slurm's PluginDir with a new inode and prints -- or, with ``write``, applies --
        the ``JobSubmitPlugins=tether`` line of slurm.conf and the plugstack.conf line.
The sandbox cluster and the README demo use exactly these functions.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tether.hooks.config import Config, load_config
from tether.hooks.native import (
    BuildError, Toolchain, find_toolchain, install_file, installed_slurm_version, read_stamp, set_conf_line,
    write_atomic, write_stamp,
)
from tether.job_submit import build as job_submit_build
from tether.spank import build as spank_build

DEFAULT_BUILD_ROOT = "/opt/tether/lib"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def source_digest(toolchain: Toolchain) -> str:
    """A digest of everything compiled into the plugins (to skip identical rebuilds)."""
    h = hashlib.sha256()
    for text in (spank_build.source(), job_submit_build.source(toolchain), job_submit_build.CDEF,
                 job_submit_build.EMBEDDING_API, job_submit_build.INIT_CODE, repr(toolchain)):
        h.update(text.encode())
    return h.hexdigest()


def default_build_dir(toolchain: Toolchain | None = None) -> Path:
    toolchain = toolchain or find_toolchain()
    return Path(DEFAULT_BUILD_ROOT) / f"slurm-{toolchain.slurm_version}"


def build_plugins(out_dir: Path | None = None, *, verbose: bool = False, reuse: bool = False,
                  log=print) -> Path:
    """Compile both plugins into ``out_dir`` (default /opt/tether/lib/slurm-<version>)."""
    toolchain = find_toolchain()
    out = Path(out_dir) if out_dir else default_build_dir(toolchain)
    digest = source_digest(toolchain)
    if reuse:
        try:
            if read_stamp(out).get("source_digest") == digest:
                return out
        except BuildError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o755)
    files = [spank_build.build(out, toolchain, verbose=verbose),
             job_submit_build.build(out, toolchain, verbose=verbose)]
    write_stamp(out, toolchain, files, source_digest=digest)
    log(f"built {', '.join(f.name for f in files)} for Slurm {toolchain.slurm_version} in {out}")
    return out


@dataclass(frozen=True)
class SlurmConf:
    """The few slurm.conf settings the installer needs (keys are case-insensitive)."""

    path: Path
    plugin_dirs: tuple[str, ...]
    plugstack: Path
    job_submit_plugins: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> "SlurmConf":
        try:
            text = path.read_text()
        except OSError as exc:
            raise BuildError(f"cannot read {path}: {exc.strerror}") from None
        settings = {}
        for line in text.splitlines():
            m = re.match(r"\s*([A-Za-z]+)\s*=\s*(\S+)", line)
            if m:
                settings[m.group(1).lower()] = m.group(2)
        plugstack = settings.get("plugstackconfig") or str(path.parent / "plugstack.conf")
        plugin_dirs = tuple(d for d in settings.get("plugindir", "").split(":") if d)
        jsp = tuple(p for p in settings.get("jobsubmitplugins", "").split(",") if p)
        return cls(path, plugin_dirs, Path(plugstack), jsp)


LAUNCHER_NAME = "tether-run"


def plugstack_line(plugin_dir: Path, config: Config) -> str:
    """The plugstack.conf line: the SPANK plugin and the settings its C side needs from the config."""
    return (f"required {plugin_dir / spank_build.SO_NAME} job_storage_root={config.job_storage_root} "
            f"launcher={plugin_dir / LAUNCHER_NAME}")


def install_launcher(plugin_dir: Path, config: Config) -> Path:
    """Write the container launcher next to the SPANK plugin (see tether.container.run), with a new
    inode (running tasks keep the old one)."""
    from tether.container.run import launcher_text
    from tether.hooks.config import DEFAULT_CONFIG_PATH

    source = None if config.source.startswith("<") else config.source
    text = launcher_text(source or DEFAULT_CONFIG_PATH, config.data["container"])
    target = plugin_dir / LAUNCHER_NAME
    write_atomic(target, text, 0o755)
    return target


def _create_dir(path: Path, mode: int) -> bool:
    """Create ``path`` (and its parents) with exactly ``mode``, whatever the umask; False if it
    existed already."""
    if path.exists():
        return False
    path.mkdir(mode=mode, parents=True)
    os.chmod(path, mode)
    return True


def ensure_image_root(path: Path, log=print) -> None:
    """The Apptainer image cache root (root-owned 0755) and its per-user area ``users/`` (1777)."""
    if _create_dir(path, 0o755):
        log(f"created apptainer_image_root {path} (root, 0755)")
    if _create_dir(path / "users", 0o1777):
        log(f"created {path / 'users'} (root, 1777): users convert their own images there")


def ensure_storage_root(path: Path, log=print) -> None:
    """Create job_storage_root (root-owned, 0755) or check an existing one: the SPANK plugin creates
    per-job directories there as root and refuses a root others can write to."""
    if _create_dir(path, 0o755):
        log(f"created job_storage_root {path} (root, 0755); it must exist on every compute node")
        return
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != 0 or st.st_mode & 0o022:
        raise BuildError(f"job_storage_root {path} must be a root-owned directory that group and "
                         f"others cannot write to (mode 0755)")


def install_plugins(build_dir: Path | None = None, *, slurm_conf: Path | None = None,
                    plugin_dir: Path | None = None, config: Config | None = None, write: bool = False,
                    log=print) -> list[str]:
    """Install both .so files and print (or apply) the config lines; returns the lines.
    ``config`` is tether's (default: the effective one) for the settings the SPANK plugin needs."""
    config = config or load_config()
    build = Path(build_dir) if build_dir else default_build_dir()
    stamp = read_stamp(build)
    built_for = stamp["toolchain"]["slurm_version"]
    installed = installed_slurm_version()
    if installed and installed != built_for:
        raise BuildError(f"the plugins in {build} were built for Slurm {built_for} but Slurm {installed} "
                         f"is installed; run `tether slurm build` again (plugins must match exactly)")
    conf = SlurmConf.read(Path(slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF))
    if plugin_dir is None:
        if not conf.plugin_dirs:
            from tether.hooks.sandbox import system_plugin_dir
            plugin_dir = Path(system_plugin_dir())
        else:
            plugin_dir = Path(conf.plugin_dirs[-1])
    plugin_dir = Path(plugin_dir)
    for name in stamp["files"]:
        install_file(build / name, plugin_dir / name)
        log(f"installed {plugin_dir / name}")
    log(f"installed {install_launcher(plugin_dir, config)}")
    plugins = conf.job_submit_plugins + (() if "tether" in conf.job_submit_plugins else ("tether",))
    jsp_line = f"JobSubmitPlugins={','.join(plugins)}"
    spank_line = plugstack_line(plugin_dir, config)
    if write:
        ensure_storage_root(Path(config.job_storage_root), log=log)
        ensure_image_root(Path(config.data["container"]["apptainer_image_root"]), log=log)
        set_conf_line(conf.path, r"JobSubmitPlugins\s*=", jsp_line)
        set_conf_line(conf.plugstack, r"(required|optional)\s+\S*spank_tether\.so", spank_line)
        log(f"wrote {jsp_line} to {conf.path} and '{spank_line}' to {conf.plugstack}; "
            f"run `scontrol reconfigure` so slurmctld loads the job_submit plugin")
    else:
        log(f"add to {conf.path}:\n  {jsp_line}\nadd to {conf.plugstack}:\n  {spank_line}\n"
            f"then run `scontrol reconfigure` (or run this command again with --write)")
    return [jsp_line, spank_line]

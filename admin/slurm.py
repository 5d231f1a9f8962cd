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

from ..hooks.config import Config
from ..hooks.configfile import load_config
from ..job_submit import build as job_submit_build
from ..native import build as native_build
from ..spank import build as spank_build
from ..system.files import install_file, set_conf_line
from ..system.toolchain import (
    LDFLAGS, PACKAGED_BUILD_STAMP, BuildError, CBuild, Toolchain, cflags, find_toolchain, installed_slurm_version,
    packaged_stamp, read_stamp, system_plugin_dir, write_stamp,
)
from .host import LAUNCHER_NAME, ensure_image_root, ensure_storage_root, install_launcher

DEFAULT_BUILD_ROOT = "/opt/tether/lib"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
# the drop-in tether's Debian package ships (commented out) for Debian's plugstack.conf to include
PLUGSTACK_DROPIN = "/etc/slurm/plugstack.conf.d/tether.conf"


def sources_digest() -> str:
    """A digest of the plugins' sources alone, whatever compiles them: install refuses a build of
    other sources (an older tether's plugin may refuse the plugstack line this one writes)."""
    h = hashlib.sha256()
    for directory in (native_build.source_dir(), spank_build.source_dir(), job_submit_build.source_dir()):
        for path in sorted(directory.glob("*.[ch]")):
            h.update(path.name.encode() + path.read_bytes())
    for text in (job_submit_build.INIT_CODE, job_submit_build.GLUE):
        h.update(text.encode())
    return h.hexdigest()


def source_digest(toolchain: Toolchain) -> str:
    """A digest of everything compiled into the plugins (to skip identical rebuilds)."""
    h = hashlib.sha256(repr((toolchain, cflags(), LDFLAGS, spank_build.EXPORTS,
                             job_submit_build.EXPORTS)).encode())
    h.update(sources_digest().encode())
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
    cbuild = CBuild(out, verbose=verbose)
    files = [spank_build.build(out, toolchain, cbuild), job_submit_build.build(out, toolchain, cbuild)]
    write_stamp(out, toolchain, files, source_digest=digest, sources=sources_digest())
    log(f"built {', '.join(f.name for f in files)} for Slurm {toolchain.slurm_version} in {out}")
    return out


@dataclass(frozen=True)
class SlurmConf:
    """The few slurm.conf settings the installer needs (keys are case-insensitive)."""

    path: Path
    plugin_dirs: tuple[str, ...]
    plugstack: Path
    job_submit_plugins: tuple[str, ...]
    slurmctld_pid_file: Path

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
        pid_file = Path(settings.get("slurmctldpidfile") or "/run/slurmctld.pid")
        return cls(path, plugin_dirs, Path(plugstack), jsp, pid_file)


def plugstack_line(plugin_dir: Path, config: Config, launcher_dir: Path | None = None) -> str:
    """The plugstack.conf line: the SPANK plugin and the settings its C side needs from the config
    (``launcher_dir``: where the container launcher is, when not beside the plugin)."""
    gateways = config.data["gateways"]["partition"]
    return (f"required {plugin_dir / spank_build.SO_NAME} job_storage_root={config.job_storage_root} "
            f"launcher={(launcher_dir or plugin_dir) / LAUNCHER_NAME} user_dirs={':'.join(config.user_dir_bases())}"
            + (f" gateway_partition={gateways}" if gateways else "")
            + (" container_batch=1" if config.data["container"]["batch"] else ""))


def spank_lines(plugstack: Path, *, depth: int = 0) -> list[tuple[Path, str]]:
    """(file, line) of every active ``spank_tether.so`` line of plugstack.conf and of the files its
    ``include`` lines name (globs, as Slurm reads them: e.g. Debian's ``include
    /etc/slurm/plugstack.conf.d/*.conf``, where tether's package puts its drop-in); comments dropped,
    words joined by one space. Unreadable files count as empty."""
    import glob

    try:
        text = Path(plugstack).read_text()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "include" and depth < 8:
            pattern = " ".join(words[1:])
            pattern = pattern if pattern.startswith("/") else str(Path(plugstack).parent / pattern)
            for name in sorted(glob.glob(pattern)):
                found += spank_lines(Path(name), depth=depth + 1)
        elif len(words) >= 2 and words[0] in ("required", "optional") and words[1].endswith(spank_build.SO_NAME):
            found.append((Path(plugstack), " ".join(words)))
    return found


# where `tether slurm install` builds the container launcher for the site's config on a host with
# tether's Debian package (the package's own was built for a host without a config file; dpkg owns
# the plugin directory): root-owned, made by the admin's command, kept on `dpkg -r`. Not under
# /var/lib/tether: launcher.state_root (the REST launcher's, its service account's) is there.
PACKAGED_LAUNCHER_DIR = "/usr/local/lib/tether/launcher"


def packaged_launcher_dir(config: Config, compiler: str | None = "gcc",
                          where: str = PACKAGED_LAUNCHER_DIR) -> Path | None:
    """Where the launcher for ``config`` goes on a package host: PACKAGED_LAUNCHER_DIR when there is
    a config file to build it for and a C compiler to build it with, else None (the package's)."""
    import shutil

    if config.source.startswith("<") or not compiler or shutil.which(compiler) is None:
        return None
    return Path(where)


def _check_chain(real: Path, *, sticky_ok_from: int) -> None:
    """``real`` and every directory above it: root's directories others cannot write to (from the
    ``sticky_ok_from``-th on, counting ``real`` as 0, one others may write to with the sticky bit,
    as /tmp: nobody else can rename root's entry in it)."""
    import stat as stat_module

    for index, part in enumerate((real, *real.parents)):
        try:
            st = part.lstat()
        except OSError as exc:
            raise BuildError(f"{part}: {exc.strerror}") from None
        writable = st.st_mode & 0o022 and not (index >= sticky_ok_from and st.st_mode & stat_module.S_ISVTX)
        if not stat_module.S_ISDIR(st.st_mode) or st.st_uid != 0 or writable:
            raise BuildError(f"{part} must be a root-owned directory (not a link) that group and others cannot "
                             f"write to: every user's container ranks start the launcher below it")


def check_root_dir(path: Path) -> None:
    """``path`` is a root-owned directory, not a link, that group and others cannot write to, and so
    is every directory above it (above it, one others may write to only with the sticky bit).
    Every user's container ranks run what is in it."""
    if path.is_symlink():
        raise BuildError(f"{path} must be a root-owned directory, not a link: every user's container ranks "
                         f"start the launcher there")
    _check_chain(Path(os.path.realpath(path)), sticky_ok_from=1)   # a root-owned link above it (/var/run) is root's


def make_root_dir(path: Path, log=print) -> None:
    """Create ``path`` and the directories it needs, each root's with mode 0755 whatever the umask,
    once what is there already above it passed the same checks; then check_root_dir."""
    missing = [part for part in (path, *path.parents) if not os.path.lexists(part)]
    if missing:
        _check_chain(Path(os.path.realpath(missing[-1].parent)), sticky_ok_from=0)
    for part in reversed(missing):
        try:
            part.mkdir(mode=0o755)
            os.chmod(part, 0o755)
        except OSError as exc:
            raise BuildError(f"cannot create {part}: {exc.strerror}") from None
        log(f"created {part} (root, 0755)")
    check_root_dir(path)


def _conf_step(path, line: str, present: bool) -> str:
    """What a config file needs, as the dry run says it: the line to add, or that it is there."""
    return f"{path} already has:\n  {line}" if present else f"add to {path}:\n  {line}"


def install_plugins(build_dir: Path | None = None, *, slurm_conf: Path | None = None,
                    plugin_dir: Path | None = None, config: Config | None = None, write: bool = False,
                    package_stamp: str = PACKAGED_BUILD_STAMP, package_launcher_dir: str = PACKAGED_LAUNCHER_DIR,
                    log=print) -> list[str]:
    """Print what installing the plugins takes -- or, with ``write``, do it: both .so files and the
    container launcher into the plugin directory, job_storage_root and the image cache created,
    slurm.conf's and plugstack.conf's lines written. Returns the two config lines.
    ``config`` is tether's (default: the effective one) for the settings the SPANK plugin needs.

    On a host with tether's Debian package and no ``build_dir``, the package's plugins are the ones
    installed (``packaged``: its build stamp): nothing is copied -- dpkg owns those files -- and
    ``write`` writes the config lines for them (and creates the directories). The package's
    container launcher was built for a host without a config file; with one (and a C compiler),
    ``write`` builds the launcher for it into ``package_launcher_dir``, and the SPANK line names
    that one."""
    config = config or load_config()
    packaged = None if build_dir else packaged_stamp(package_stamp)
    if packaged:
        build, stamp = Path(packaged["plugin_dir"]), packaged
        if packaged.get("sources") not in (None, sources_digest()):
            # this tether is not the package's (a venv's, newer): its plugstack line may say what the
            # package's plugins do not understand
            raise BuildError(f"the plugins of tether's Debian package in {build} were built from other sources "
                             f"than this tether's: use the package's own tether (/usr/bin/tether), or build "
                             f"plugins of this one (`tether slurm build --out DIR`) and pass --build-dir DIR")
    else:
        build = Path(build_dir) if build_dir else default_build_dir()
        stamp = read_stamp(build)
        if stamp.get("sources") != sources_digest():
            # an upgrade without a build: the older plugin would meet this version's plugstack line
            # (an argument it does not know fails every srun and sbatch of the cluster)
            raise BuildError(f"the plugins in {build} were built from other sources than this tether's (an "
                             f"earlier version's?): run `tether slurm build` again first"
                             + (f" (--out {build})" if build_dir else ""))
    built_for = stamp["toolchain"]["slurm_version"]
    installed = installed_slurm_version()
    if installed and installed != built_for:
        raise BuildError(f"the plugins in {build} were built for Slurm {built_for} but Slurm {installed} "
                         f"is installed; " + ("install tether's package built for this Slurm (`make deb` on a "
                                              "host that has it)" if packaged else
                                              "run `tether slurm build` again (plugins must match exactly)"))
    conf = SlurmConf.read(Path(slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF))
    if packaged and plugin_dir and Path(plugin_dir) != build:
        raise BuildError(f"tether's Debian package installed its plugins in {build}; --plugin-dir {plugin_dir} "
                         f"would name other files: build your own (`tether slurm build --out DIR`) and pass "
                         f"--build-dir DIR, or leave --plugin-dir out")
    plugin_dir = Path(build if packaged else
                      plugin_dir or (conf.plugin_dirs[-1] if conf.plugin_dirs else system_plugin_dir()))
    plugins = conf.job_submit_plugins + (() if "tether" in conf.job_submit_plugins else ("tether",))
    jsp_line = f"JobSubmitPlugins={','.join(plugins)}"
    launcher_dir = packaged_launcher_dir(config, where=package_launcher_dir) if packaged else None
    spank_line = plugstack_line(plugin_dir, config, launcher_dir)
    stacked = spank_lines(conf.plugstack)
    elsewhere = [(path, line) for path, line in stacked if path != Path(conf.plugstack)]
    if not write:
        where = elsewhere[0][0] if elsewhere else conf.plugstack
        what = (f"{', '.join(stamp['files'])} are in {plugin_dir} (tether's Debian package)"
                + (f"; would build {LAUNCHER_NAME} for {config.source} into {launcher_dir}" if launcher_dir else
                   f", {LAUNCHER_NAME} too") if packaged
                else f"would install {', '.join(stamp['files'])} and {LAUNCHER_NAME} into {plugin_dir}")
        log(f"{what}\n"
            f"{_conf_step(conf.path, jsp_line, 'tether' in conf.job_submit_plugins)}\n"
            f"{_conf_step(where, spank_line, spank_line in (line for _, line in stacked))}\n"
            f"(nothing was changed: run this command again with --write to do it, then "
            f"`scontrol reconfigure`)")
        return [jsp_line, spank_line]
    if elsewhere and elsewhere[0][1] != spank_line:
        # an included file (the package's plugstack.conf.d/tether.conf) has the line: a second one
        # in plugstack.conf would load the plugin twice
        raise BuildError(f"{elsewhere[0][0]} (included by {conf.plugstack}) has another {spank_build.SO_NAME} "
                         f"line; change it there to:\n  {spank_line}")
    if packaged:
        log(f"the plugins of tether's Debian package are in {plugin_dir}: nothing to copy")
        if launcher_dir:
            make_root_dir(launcher_dir, log=log)
            log(f"installed {install_launcher(launcher_dir, config, log=log)} for {config.source}")
        elif config.source.startswith("<"):
            log(f"{LAUNCHER_NAME}: the package's (built for a host without a config file)")
        else:
            log(f"{LAUNCHER_NAME}: the package's, with no C compiler here to build one for {config.source}: "
                f"every container rank takes the Python launcher (correct, ~12 ms of CPU more per rank); "
                f"install gcc and run this again")
    else:
        for name in stamp["files"]:
            install_file(build / name, plugin_dir / name)
            log(f"installed {plugin_dir / name}")
        log(f"installed {install_launcher(plugin_dir, config, log=log)}")
    ensure_storage_root(Path(config.job_storage_root), log=log)
    ensure_image_root(Path(config.data["container"]["apptainer_image_root"]), log=log)
    set_conf_line(conf.path, r"JobSubmitPlugins\s*=", jsp_line)
    if elsewhere:
        stacked_where = f"left '{spank_line}' in {elsewhere[0][0]}, which has it"
    else:
        set_conf_line(conf.plugstack, r"(required|optional)\s+\S*spank_tether\.so", spank_line)
        stacked_where = f"wrote '{spank_line}' to {conf.plugstack}"
    log(f"wrote {jsp_line} to {conf.path} and {stacked_where}; "
        f"run `scontrol reconfigure` so slurmctld loads the job_submit plugin")
    return [jsp_line, spank_line]

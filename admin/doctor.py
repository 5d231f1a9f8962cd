"""``tether doctor``: what an admin gets wrong, checked on this host, one line per check.

Each check says ``ok``, ``warn`` or ``FAIL`` with what it found and, for a failure, the fix. The
exit status is 1 when any check failed. Nothing is changed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..container.run import LAUNCHER_NAME, PYTHON_LAUNCHER_NAME, baked_identity, config_identity
from ..container.runtimes.podman import Podman
from ..hooks.config import Config
from ..hooks.layout import USER_STORE_ROOT, user_dir_base
from ..hooks.configfile import ConfigError, config_path, load_config
from ..hooks.rankenv import master_port_range
from ..hooks.surface import GATEWAY_PORT_BASE, GATEWAY_PORT_JOBS
from ..spank import build as spank_build
from ..system.proc import CommandError, run_command
from ..system.toolchain import BuildError, installed_slurm_version, packaged_stamp, read_stamp
from .slurm import DEFAULT_BUILD_ROOT, DEFAULT_SLURM_CONF, PLUGSTACK_DROPIN, SlurmConf, default_build_dir, spank_lines

OK, WARN, FAIL = "ok", "warn", "FAIL"
EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
RESERVED_PORTS = "/proc/sys/net/ipv4/ip_local_reserved_ports"


PACKAGED_PYTHON = "/usr/lib/python3/dist-packages"     # where tether's Debian package puts tether


def packaged_by(module_file: str | None = None) -> str | None:
    """The Debian package that installed this tether (``dpkg-query -S`` of its files), or None
    when it came from elsewhere (a venv: `make install`)."""
    path = os.path.realpath(module_file or __file__)
    if not path.startswith(PACKAGED_PYTHON + "/"):
        return None
    try:
        out = run_command(["dpkg-query", "-S", path], timeout=30).stdout
    except (CommandError, OSError):
        return None
    return out.split(":", 1)[0].strip() or None


@dataclass(frozen=True)
class Finding:
    """One check's outcome."""

    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


class Doctor:
    """The checks, over one tether config, one slurm.conf and the job users to check for."""

    def __init__(self, config_file: str | None, slurm_conf: str | None = None, users: tuple[str, ...] = ()):
        self.config_file = config_file
        self.slurm_conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
        self.users = users
        self.config: Config | None = None
        self.conf: SlurmConf | None = None

    def run(self) -> list[Finding]:
        findings: list[Finding] = []
        for check in self.checks():
            try:
                findings.extend(check())
            except Exception as exc:  # a check that breaks is a finding, not a crash
                findings.append(Finding(FAIL, check.__name__.replace("check_", "").replace("_", " "),
                                        f"the check itself failed: {exc}"))
        return findings

    def checks(self) -> list[Callable[[], Iterator[Finding]]]:
        return [self.check_config, self.check_slurm, self.check_plugins, self.check_plugstack,
                self.check_slurmctld_config, self.check_storage, self.check_stores, self.check_cluster_store,
                self.check_runtimes,
                self.check_enroot, self.check_plain_http, self.check_job_users, self.check_gpus, self.check_ports]

    # --- the checks --------------------------------------------------------------------------
    def check_config(self) -> Iterator[Finding]:
        path, _ = config_path(self.config_file)
        try:
            self.config = load_config(self.config_file)
        except ConfigError as exc:
            yield Finding(FAIL, "config", f"{exc} (`tether config check` lists every problem)")
            return
        yield Finding(OK, "config", f"{self.config.source} is valid" if os.path.exists(path)
                      else f"{path} does not exist: the built-in defaults apply")

    def check_slurm(self) -> Iterator[Finding]:
        version = installed_slurm_version()
        if version is None:
            yield Finding(FAIL, "slurm", "neither slurmctld nor srun is installed on this host")
            return
        try:
            self.conf = SlurmConf.read(self.slurm_conf)
        except BuildError as exc:
            yield Finding(FAIL, "slurm", f"Slurm {version}; {exc}")
            return
        yield Finding(OK, "slurm", f"Slurm {version}, {self.slurm_conf}")
        if "tether" in self.conf.job_submit_plugins:
            yield Finding(OK, "slurm.conf", f"JobSubmitPlugins={','.join(self.conf.job_submit_plugins)}")
        else:
            yield Finding(FAIL, "slurm.conf", f"JobSubmitPlugins does not name tether in {self.slurm_conf}: "
                          f"`tether slurm install --write`, then `scontrol reconfigure`")

    def _plugin_dir(self) -> Path | None:
        if self.conf is None:
            return None
        line = self._plugstack_line()
        if line:
            return Path(line.split()[1]).parent
        return Path(self.conf.plugin_dirs[-1]) if self.conf.plugin_dirs else None

    def _launcher_dir(self) -> Path | None:
        """The directory of the container launcher the plugstack line names (``launcher=``)."""
        line = self._plugstack_line()
        for word in (line or "").split()[2:]:
            if word.startswith("launcher="):
                return Path(word.split("=", 1)[1]).parent
        return None

    def _rebuild(self, slurm: str | None) -> str:
        """How to get plugins that fit this Slurm: rebuild and install them -- or, where tether
        came from its Debian package, the package built for this Slurm (an install over the
        package's files would be undone by its next upgrade, and removed by none)."""
        package = packaged_by()
        if package:
            return (f"tether came from the Debian package {package}: install the one built for "
                    f"Slurm {slurm or 'this'} (`make deb` on a build host, then `dpkg -i` it; "
                    f"`apt-get install --reinstall {package}` restores its own files)")
        return "`tether slurm build`, then `tether slurm install --write`"

    def check_plugins(self) -> Iterator[Finding]:
        plugin_dir = self._plugin_dir()
        if plugin_dir is None:
            return
        packaged = packaged_stamp()          # tether's Debian package: its build, where it put it
        if packaged:
            build, stamp = Path(packaged["plugin_dir"]), packaged
        else:
            try:
                build = default_build_dir()
                stamp = read_stamp(build)
            except BuildError:
                build, stamp = Path(DEFAULT_BUILD_ROOT), None
        names = stamp["files"] if stamp else [spank_build.SO_NAME]
        launcher_dir = self._launcher_dir() or plugin_dir
        missing = [str(plugin_dir / n) for n in names if not (plugin_dir / n).is_file()]
        missing += [str(launcher_dir / n) for n in (LAUNCHER_NAME, PYTHON_LAUNCHER_NAME) if not (launcher_dir / n).is_file()]
        if missing:
            yield Finding(FAIL, "plugins", f"{', '.join(missing)} missing: "
                          f"{self._rebuild(installed_slurm_version())}")
            return
        installed = installed_slurm_version()
        built_for = stamp["toolchain"]["slurm_version"] if stamp else None
        if built_for and installed and built_for != installed:
            yield Finding(FAIL, "plugins", f"built for Slurm {built_for}, but Slurm {installed} is installed: "
                          f"{self._rebuild(installed)}")
            return
        stale = [n for n in names if stamp and (build / n).is_file()
                 and (build / n).read_bytes() != (plugin_dir / n).read_bytes()]
        if stale:
            yield Finding(WARN, "plugins", f"{', '.join(stale)} in {plugin_dir} differ from the last build in "
                          f"{build}: `tether slurm install --write` installs it")
            return
        baked = baked_identity(launcher_dir / PYTHON_LAUNCHER_NAME)
        if self.config and baked is not None and baked[0] == self.config.source \
                and baked[1] != config_identity(self.config.source):
            yield Finding(WARN, "plugins", f"{LAUNCHER_NAME} was installed for an earlier {self.config.source}: every "
                          f"container rank takes the slower Python launcher, which reads the file again; "
                          f"`tether slurm install --write` bakes the new one in")
            return
        yield Finding(OK, "plugins", f"{', '.join(names)} in {plugin_dir}, {LAUNCHER_NAME} and {PYTHON_LAUNCHER_NAME} "
                      f"in {launcher_dir}"
                      + (f", built for Slurm {built_for}" if built_for else ""))

    def _plugstack_line(self) -> str | None:
        """The first spank_tether.so line of plugstack.conf or a file it includes."""
        lines = spank_lines(self.conf.plugstack) if self.conf else []
        return lines[0][1] if lines else None

    def check_plugstack(self) -> Iterator[Finding]:
        if self.conf is None:
            return
        line = self._plugstack_line()
        if line is None:
            yield Finding(FAIL, "plugstack.conf", f"no {spank_build.SO_NAME} line in {self.conf.plugstack} or a "
                          f"file it includes: `tether slurm install --write` (with tether's Debian package: "
                          f"uncomment the line of {PLUGSTACK_DROPIN})")
            return
        args = dict(w.split("=", 1) for w in line.split()[2:] if "=" in w)
        if self.config and args.get("job_storage_root") != self.config.job_storage_root:
            yield Finding(FAIL, "plugstack.conf", f"job_storage_root={args.get('job_storage_root')} there, "
                          f"{self.config.job_storage_root} in {self.config.source}: `tether slurm install --write` "
                          f"again after changing the config")
            return
        gateways = self.config.data["gateways"]["partition"] if self.config else None
        if self.config and args.get("gateway_partition") != gateways:
            yield Finding(FAIL, "plugstack.conf", f"gateway_partition={args.get('gateway_partition')} there, "
                          f"gateways.partition: {gateways} in {self.config.source}: `tether slurm install "
                          f"--write` again after changing the config")
            return
        batch = bool(self.config and self.config.data["container"]["batch"])
        if self.config and (args.get("container_batch") == "1") != batch:
            yield Finding(FAIL, "plugstack.conf", f"container_batch={args.get('container_batch', '0')} there, "
                          f"container.batch: {str(batch).lower()} in {self.config.source}: `tether slurm install "
                          f"--write` again after changing the config")
            return
        bases = ":".join(self.config.user_dir_bases()) if self.config else None
        if self.config and args.get("user_dirs") != bases:
            yield Finding(FAIL, "plugstack.conf", f"user_dirs={args.get('user_dirs')} there, {bases} from the "
                          f"stores in {self.config.source} (where root makes each user's directory on a node): "
                          f"`tether slurm install --write` again after changing the config")
            return
        launcher = args.get("launcher")
        if not launcher or not os.access(launcher, os.X_OK):
            yield Finding(FAIL, "plugstack.conf", f"launcher={launcher} is not an executable file: "
                          f"`tether slurm install --write`")
            return
        yield Finding(OK, "plugstack.conf", f"{self.conf.plugstack}: {line}")

    def check_slurmctld_config(self) -> Iterator[Finding]:
        """The config slurmctld's job_submit plugin reads ($TETHER_CONFIG in its environment, else
        the default) must be the one checked here."""
        pid = self._slurmctld_pid()
        if pid is None:
            yield Finding(WARN, "slurmctld", "not running on this host (or its pid file is unreadable): the "
                          "config its job_submit plugin reads was not compared")
            return
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError as exc:
            yield Finding(WARN, "slurmctld", f"cannot read its environment ({exc.strerror}; run as root)")
            return
        env = dict(e.decode(errors="replace").split("=", 1) for e in environ if b"=" in e)
        theirs, _ = config_path(None, env)
        ours, _ = config_path(self.config_file)
        if os.path.realpath(theirs) != os.path.realpath(ours):
            yield Finding(FAIL, "slurmctld", f"its job_submit plugin reads {theirs}, this check read {ours}: "
                          f"run `tether doctor --config {theirs}` (or make both the same file)")
            return
        yield Finding(OK, "slurmctld", f"pid {pid} reads {theirs}")

    def _slurmctld_pid(self) -> int | None:
        if self.conf is None:
            return None
        try:
            pid = int(self.conf.slurmctld_pid_file.read_text().split()[0])
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError, IndexError):
            return None

    def check_storage(self) -> Iterator[Finding]:
        if self.config is None:
            return
        for name, path, shared in (("job_storage_root", self.config.job_storage_root, False),
                                   ("apptainer_image_root", self.config.data["container"]["apptainer_image_root"],
                                    True)):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                status = WARN if shared else FAIL
                yield Finding(status, name, f"{path} does not exist: `tether slurm install --write` creates it "
                              f"(on every compute node)")
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                yield Finding(FAIL, name, f"{path} must be a root-owned directory that group and others cannot "
                              f"write to: `chown root: {path}; chmod 755 {path}`")
                continue
            yield Finding(OK, name, f"{path} (root, {stat.S_IMODE(st.st_mode):04o})")

    def check_stores(self) -> Iterator[Finding]:
        """Each user's store on a node is safe from other users only where root makes the directory
        named after the user (``{uid}`` a whole path component, in a directory only root writes); a
        store template like ``/var/tmp/tether-podman-{uid}`` (an earlier default) is the user's own
        making, and in a directory everyone writes any user can make another's first."""
        if self.config is None:
            return
        for name in ("podman", "enroot"):
            template = self.config.runtime(name).get("store") or ""
            if not template or user_dir_base(template) is not None:
                continue
            parent = template.split("{uid}", 1)[0].rpartition("/")[0] or "/"
            try:
                st = os.stat(parent)
            except OSError:
                continue
            if st.st_mode & 0o002:
                yield Finding(WARN, f"container.{name}.store", f"{template}: {parent} is writable by every user, "
                              f"so any user can make another's store there first and deny them every container "
                              f"step; use a path with {{uid}} as a whole component in a directory only root "
                              f"writes (the default: {USER_STORE_ROOT}/{{uid}}/{name})")

    def check_cluster_store(self) -> Iterator[Finding]:
        """container.cluster_store on a node: the account, the store's directories (its, trusted),
        squashfuse and /dev/fuse for the users' mounts, the node's image service."""
        if self.config is None:
            return
        conf = self.config.data["container"].get("cluster_store") or {}
        if not conf.get("root"):
            return
        import pwd

        from ..container.imagestore import ImageStore, StoreError

        try:
            account = pwd.getpwnam(conf["account"])
        except KeyError:
            yield Finding(FAIL, "cluster store", f"its account {conf['account']} does not exist on this host "
                          f"(README: The cluster image store)")
            return
        if account.pw_uid == 0:
            yield Finding(FAIL, "cluster store", "its account is root's: the store and its service need an account of "
                          "their own (never root)")
            return
        try:
            ImageStore(conf["root"], account.pw_uid)._dir("images")
            yield Finding(OK, "cluster store", f"{conf['root']} ({account.pw_name}'s)")
        except StoreError as exc:
            yield Finding(FAIL, "cluster store", f"{exc}")
        if not shutil.which("squashfuse"):
            yield Finding(FAIL, "cluster store", "squashfuse is not installed: ranks cannot mount the store's "
                          "images (apt install squashfuse)")
        try:
            mode = os.stat("/dev/fuse").st_mode
            if mode & 0o006 != 0o006:
                yield Finding(FAIL, "cluster store", f"/dev/fuse is {stat.S_IMODE(mode):04o}: users cannot mount "
                              f"the store's images (udev makes it 0666)")
        except OSError:
            yield Finding(FAIL, "cluster store", "no /dev/fuse: users cannot mount the store's images")
        if self._found("enroot"):
            yield from self._enroot_store_needs()
        sock = conf.get("socket") or ""
        try:
            if not stat.S_ISSOCK(os.stat(sock).st_mode):
                raise FileNotFoundError
        except OSError:
            yield Finding(WARN, "cluster store", f"no image service at {sock} on this host: its ranks pull into "
                          f"each user's own store (tether-images.socket)")

    def _enroot_store_needs(self) -> Iterator[Finding]:
        """What `enroot start FILE` (an enroot rank from the store) needs beyond squashfuse and
        /dev/fuse (enroot 4.1.2, runtime.sh): unsquashfs that reads the store's zstd, `mountpoint`,
        and an overlay a user may mount: the kernel's in a user namespace (5.11 and later; enroot's
        default) or fuse-overlayfs (ENROOT_NATIVE_OVERLAYFS=n)."""
        try:
            said = run_command(["unsquashfs", "-help"], check=False, timeout=20)
            readers = (said.stdout + said.stderr).split("Decompressors available:", 1)[-1].split()
        except CommandError:
            readers = []
        if "zstd" not in readers:
            yield Finding(FAIL, "cluster store", "unsquashfs cannot read zstd (or is not installed): enroot ranks "
                          "cannot start the store's images (apt install squashfs-tools)")
        if not shutil.which("mountpoint"):
            yield Finding(FAIL, "cluster store", "mountpoint is not installed: enroot cannot start the store's "
                          "images (apt install util-linux)")
        release = tuple(int(n) for n in os.uname().release.split("-")[0].split(".")[:2] if n.isdigit())
        if release < (5, 11) and not shutil.which("fuse-overlayfs"):
            yield Finding(WARN, "cluster store", f"kernel {os.uname().release} lets no user mount an overlay and "
                          f"fuse-overlayfs is not installed: enroot ranks cannot start the store's images "
                          f"(install fuse-overlayfs and set ENROOT_NATIVE_OVERLAYFS=n in enroot.conf)")

    def check_runtimes(self) -> Iterator[Finding]:
        if self.config is None:
            return
        container = self.config.data["container"]
        default = container["runtime"]
        for name in ("apptainer", "singularity", "podman", "enroot"):
            binary = container[name]["binary"]
            found = self._found(name)
            if not found:
                if name == default:
                    yield Finding(FAIL, f"runtime {name}", f"{binary} not found (the default runtime): install "
                                  f"it or set container.{name}.binary")
                continue
            asked = VERSION_ARGS.get(name, ["--version"])
            try:
                version = run_command([found, *asked], timeout=20).stdout.strip().splitlines()[0]
            except (CommandError, IndexError) as exc:
                yield Finding(FAIL if name == default else WARN, f"runtime {name}",
                              f"{found} {' '.join(asked)} failed: {exc}")
                continue
            yield Finding(OK, f"runtime {name}", f"{found}: {version}" + (" (default)" if name == default else ""))

    def _found(self, name: str) -> str | None:
        """The configured runtime's binary, when this host has it."""
        binary = self.config.data["container"][name]["binary"] if self.config else name
        return binary if os.path.isabs(binary) and os.access(binary, os.X_OK) else shutil.which(binary)

    def check_enroot(self) -> Iterator[Finding]:
        """What `enroot import` (a registry image's first container) needs beside enroot itself:
        its helper programs, the tools its scripts call, and -- run by a user, not root -- the
        capabilities enroot's "+caps" package gives two helpers. Only where enroot is installed."""
        enroot = self._found("enroot") if self.config is not None else None
        if enroot is None:
            return
        where = [os.path.dirname(os.path.realpath(enroot)), os.path.dirname(enroot)]
        path = os.pathsep.join([*where, os.environ.get("PATH", "")])
        helpers = {name: shutil.which(name, path=path) for name in ENROOT_HELPERS}
        missing = [name for name, found in helpers.items() if not found]
        if missing:
            yield Finding(FAIL if self.config.data["container"]["runtime"] == "enroot" else WARN, "enroot helpers",
                          f"{', '.join(missing)} not found beside {enroot} or on PATH: enroot's package installs "
                          f"them with it (reinstall enroot)")
        tools = [f"{tool} ({package})" for tool, package in ENROOT_TOOLS if not shutil.which(tool, path=path)]
        if tools:
            yield Finding(WARN, "enroot tools", f"`enroot import` (every registry image's first container) calls "
                          f"{', '.join(tools)}: not on PATH; install the Debian packages named")
        lacking = []
        for name, caps in ENROOT_CAPS.items():
            found = helpers.get(name)
            if found and not set(caps) <= file_capabilities(found):
                lacking.append(f"{found} ({'+'.join(CAP_NAMES[c] for c in caps)})")
        if lacking:
            yield Finding(WARN, "enroot capabilities",
                          f"{', '.join(lacking)} lack the file capabilities that let users import and convert "
                          f"images: a job user's `enroot import` fails; enroot's \"+caps\" package sets them "
                          f"(enroot+caps), or give users images already converted (squashfs)")
        if not missing and not tools and not lacking:
            yield Finding(OK, "enroot helpers", f"helpers, tools and capabilities for `enroot import` ({enroot})")

    def check_plain_http(self) -> Iterator[Finding]:
        """A registry podman is told to reach over plain http (registries.conf ``insecure = true``)
        is refused by the other runtimes unless each is told too: enroot without ENROOT_ALLOW_HTTP
        (curl's TLS error, exit 35), SingularityCE without SINGULARITY_NOHTTPS ("server gave HTTP
        response to HTTPS client") -- both recorded. Said for each runtime installed here, with what
        the setting costs: it is not per registry (enroot then fetches every registry over http)."""
        if self.config is None:
            return
        podman_env = self.config.runtime("podman").get("env") or {}
        conf = podman_env.get("CONTAINERS_REGISTRIES_CONF") or os.environ.get("CONTAINERS_REGISTRIES_CONF") \
            or "/etc/containers/registries.conf"
        registries = plain_http_registries(conf)
        if not registries:
            return
        named = ", ".join(registries)
        for name, variable, value, refusal in PLAIN_HTTP_SETTINGS:
            if self._found(name) is None:
                continue
            env = self.config.runtime(name).get("env") or {}
            given = env.get(variable, os.environ.get(variable))
            if told(name, given):
                yield Finding(WARN, f"{name} plain http",
                              f"{variable}={given} lets {name} use {named} (plain http in {conf}) -- and makes it use "
                              f"plain http for every registry, with their tokens in clear: serving the registry "
                              f"over TLS instead is safer")
                continue
            yield Finding(WARN, f"{name} plain http",
                          f"{named} speak{'s' if len(registries) == 1 else ''} plain http ({conf}: insecure = true); "
                          f"{name} fetches over https only, so its images from there fail ({refusal}). Serve the "
                          f"registry over TLS; {variable}={value} (container.{name}.env) would make {name} use "
                          f"plain http for every registry, docker.io and nvcr.io too, their tokens in clear")

    def check_job_users(self) -> Iterator[Finding]:
        """Rootless podman needs subordinate ids for each job user, and a run directory it owns."""
        if self.config is None or not self._uses("podman"):
            return
        if not self.users:
            yield Finding(WARN, "job users", "none named: `tether doctor --user NAME` checks subuid/subgid and "
                          "podman's run directory for them")
            return
        for user in self.users:
            try:
                account = pwd.getpwnam(user)
            except KeyError:
                yield Finding(FAIL, f"user {user}", "no such user on this host")
                continue
            tables = {path: _subid_ranges(path) for path in SUBID_FILES}
            missing = [path for path, ranges in tables.items() if not _own_ranges(ranges, account)]
            if missing:
                start = free_subid_start(tables.values())
                yield Finding(FAIL, f"user {user}", f"no range in {' and '.join(missing)} (rootless podman needs "
                              f"one): `usermod --add-subuids {start}-{start + SUBID_COUNT - 1} --add-subgids "
                              f"{start}-{start + SUBID_COUNT - 1} {user}` (a range no other user has here)")
                continue
            clashes = [f"{path}: {clash}" for path, ranges in tables.items() for clash in _clashes(ranges, account)]
            if clashes:
                yield Finding(FAIL, f"user {user}", f"{'; '.join(clashes)} -- podman then fails (\"newuidmap: write "
                              f"to uid_map failed\"): give each user a range of their own")
                continue
            # podman's run directory for tether's containers (Podman.run_dir): root makes it for the
            # user at their first container step here, never from the job's XDG_RUNTIME_DIR
            run = Path(Podman(self.config.runtime("podman")).run_dir(account.pw_uid))
            if run.exists() and (run.is_symlink() or run.lstat().st_uid != account.pw_uid):
                yield Finding(FAIL, f"user {user}", f"{run} is not owned by {user}: podman refuses it; remove it")
                continue
            yield Finding(OK, f"user {user}", "subuid and subgid ranges; podman's run directory "
                          f"{'is ' + str(run) if run.exists() else 'will be ' + str(run) + ' (made at their first container step)'}")

    def check_gpus(self) -> Iterator[Finding]:
        """GPU slots in podman containers need a CDI spec for the configured kind."""
        if self.config is None or not self._uses("podman"):
            return
        slot_types = {self.config.data["slot_type"]} | {
            o.get("slot_type") for o in self.config.data["partition_overrides"].values() if o.get("slot_type")}
        if "cuda" not in slot_types:
            return
        podman = self.config.data["container"]["podman"]
        from ..container.runtimes.podman import spec_has_kind

        dirs = podman["cdi_spec_dirs"]
        if not any(spec_has_kind(d, podman["cdi_kind"]) for d in dirs):
            yield Finding(FAIL, "cdi", f"GPU slots are configured but no CDI spec for {podman['cdi_kind']} is in "
                          f"{', '.join(dirs)}: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` on every "
                          f"GPU node")
            return
        yield Finding(OK, "cdi", f"a CDI spec for {podman['cdi_kind']} in {', '.join(dirs)}")

    def check_ports(self) -> Iterator[Finding]:
        """The ports tether derives (MASTER_PORT, gateway daemons) must lie outside this node's
        ephemeral range, or an outgoing connection may hold one when a rank or daemon binds it."""
        try:
            low, high = map(int, Path(EPHEMERAL_PORTS).read_text().split()[:2])
        except (OSError, ValueError):
            return
        reserved = _reserved_ports()
        ranges = [("MASTER_PORT", *master_port_range())]
        if self.config is not None and self.config.data["gateways"]["partition"]:
            port = self.config.data["gateways"]["port"]
            first = port if port is not None else GATEWAY_PORT_BASE
            last = port + 15 if port is not None else GATEWAY_PORT_BASE + GATEWAY_PORT_JOBS * 16 - 1
            ranges.append(("gateways.port" if port is not None else "gateway ports", first, last))
        clashes = [f"{name} {first}-{last}" for name, first, last in ranges
                   if any(low <= p <= high and p not in reserved for p in range(first, last + 1))]
        if clashes:
            yield Finding(WARN, "ports", f"{', '.join(clashes)} overlap{'s' if len(clashes) == 1 else ''} this "
                          f"node's ephemeral ports {low}-{high} ({EPHEMERAL_PORTS}): a port an outgoing "
                          f"connection holds cannot be bound; reserve it on every compute node "
                          f"(net.ipv4.ip_local_reserved_ports) or move the range")
            return
        yield Finding(OK, "ports", ", ".join(f"{n} {a}-{b}" for n, a, b in ranges)
                      + f" outside the ephemeral ports {low}-{high}")

    def _uses(self, runtime: str) -> bool:
        return self.config is not None and self.config.data["container"]["runtime"] == runtime


def _reserved_ports() -> set[int]:
    """The ports in net.ipv4.ip_local_reserved_ports (\"8080,12288-32767\"): never ephemeral."""
    ports: set[int] = set()
    try:
        text = Path(RESERVED_PORTS).read_text().strip()
    except OSError:
        return ports
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        try:
            ports.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return ports


# enroot's helper programs (installed beside it), and the tools its import scripts call: (tool, package)
ENROOT_HELPERS = ("enroot-aufs2ovlfs", "enroot-mksquashovlfs", "enroot-mount", "enroot-nsenter", "enroot-switchroot")
ENROOT_TOOLS = (("curl", "curl"), ("jq", "jq"), ("mksquashfs", "squashfs-tools"), ("unsquashfs", "squashfs-tools"),
                ("parallel", "parallel"), ("zstd", "zstd"))
CAP_MKNOD, CAP_SYS_ADMIN = 27, 21
CAP_NAMES = {CAP_MKNOD: "cap_mknod", CAP_SYS_ADMIN: "cap_sys_admin"}
# what enroot's "+caps" package gives its helpers (setcap ... +pe) so that users can convert images
ENROOT_CAPS = {"enroot-aufs2ovlfs": (CAP_SYS_ADMIN, CAP_MKNOD), "enroot-mksquashovlfs": (CAP_SYS_ADMIN,)}
# (runtime, the variable that lets it use a plain-http registry, its value, what it says without)
PLAIN_HTTP_SETTINGS = (
    ("enroot", "ENROOT_ALLOW_HTTP", "y", "curl: (35) ... wrong version number, exit 35"),
    ("singularity", "SINGULARITY_NOHTTPS", "1", "server gave HTTP response to HTTPS client"),
    ("apptainer", "APPTAINER_NOHTTPS", "1", "server gave HTTP response to HTTPS client"),
)


def told(runtime: str, value: str | None) -> bool:
    """Does ``value`` of the runtime's plain-http variable switch it on, as the runtime reads it:
    enroot tests for a non-empty value (docker.sh: ``[ -n "${ENROOT_ALLOW_HTTP-}" ]``), Singularity
    and Apptainer parse a boolean (Go's strconv.ParseBool)."""
    if value is None:
        return False
    if runtime == "enroot":
        return value != ""
    return value in ("1", "t", "T", "true", "TRUE", "True")


VFS_CAP_REVISIONS = {0x01000000: 12, 0x02000000: 20, 0x03000000: 24}   # revision -> its length


def file_capabilities(path: str) -> set[int]:
    """The permitted capabilities in a file's ``security.capability`` attribute, when they are also
    effective (setcap's ``+pe``) and apply on the host: empty when it has none, they are not
    effective, or they are a user namespace's (revision 3 with a non-zero root id: setcap run
    inside a container, which grants nothing out here)."""
    try:
        raw = os.getxattr(path, "security.capability")
    except OSError:
        return set()
    if len(raw) < 4:
        return set()
    magic = int.from_bytes(raw[0:4], "little")
    revision = magic & 0xFF000000
    if VFS_CAP_REVISIONS.get(revision) != len(raw) or not magic & 0x1:      # 0x1: VFS_CAP_FLAGS_EFFECTIVE
        return set()
    if revision == 0x03000000 and int.from_bytes(raw[20:24], "little") != 0:
        return set()
    permitted = int.from_bytes(raw[4:8], "little")
    if revision != 0x01000000:                       # revisions 2 and 3: a second word
        permitted |= int.from_bytes(raw[12:16], "little") << 32
    return {bit for bit in range(64) if permitted >> bit & 1}


def plain_http_registries(conf: str) -> list[str]:
    """The registries a registries.conf marks plain http: each ``[[registry]]`` with ``insecure =
    true`` (its location, else prefix) and the older ``[registries.insecure] registries = [...]``,
    in the file and its drop-in directory (``<file>.d/*.conf``); unreadable files add nothing."""
    import glob
    import tomllib

    found: list[str] = []
    for path in [conf, *sorted(glob.glob(os.path.join(glob.escape(conf + ".d"), "*.conf")))]:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, ValueError):          # TOMLDecodeError and UnicodeDecodeError are ValueErrors
            continue
        entries = data.get("registry")
        for r in entries if isinstance(entries, list) else []:
            where = isinstance(r, dict) and (r.get("location") or r.get("prefix"))
            if where and r.get("insecure") is True and str(where) not in found:
                found.append(str(where))
        old = data.get("registries")
        insecure = old.get("insecure") if isinstance(old, dict) else None
        for where in (insecure.get("registries") if isinstance(insecure, dict) else None) or []:
            if isinstance(where, str) and where not in found:
                found.append(where)
    return found


# how each runtime tells its version: enroot has no --version (usage, exit 1: recorded with 4.1.2)
VERSION_ARGS = {"enroot": ["version"]}
SUBID_FILES = ("/etc/subuid", "/etc/subgid")
SUBID_COUNT = 65536          # what useradd gives each user (login.defs SUB_UID_COUNT)


def _subid_ranges(path: str) -> list[tuple[str, int, int]]:
    """``(owner, first id, count)`` of each well-formed line of a subuid/subgid file."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        owner, _, rest = line.strip().partition(":")
        first, _, count = rest.partition(":")
        if owner and first.isdigit() and count.isdigit() and int(count) > 0:
            ranges.append((owner, int(first), int(count)))
    return ranges


def _own_ranges(ranges: list[tuple[str, int, int]], account: pwd.struct_passwd) -> list[tuple[str, int, int]]:
    names = {account.pw_name, str(account.pw_uid)}
    return [r for r in ranges if r[0] in names]


def _clashes(ranges: list[tuple[str, int, int]], account: pwd.struct_passwd) -> list[str]:
    """How this user's ranges overlap another user's, or repeat one of their own."""
    mine = _own_ranges(ranges, account)
    said = []
    for owner, first, count in ranges:
        for _, m_first, m_count in mine:
            if first < m_first + m_count and m_first < first + count:
                if owner not in (account.pw_name, str(account.pw_uid)):
                    said.append(f"{m_first}-{m_first + m_count - 1} overlaps {owner}'s {first}-{first + count - 1}")
    own = sorted((f, c) for _, f, c in mine)
    for (a, n), (b, _) in zip(own, own[1:]):
        if b < a + n:
            said.append(f"{account.pw_name} has overlapping lines ({a}-{a + n - 1} and {b}-...)")
    return said


def free_subid_start(tables) -> int:
    """The first id after every range in every table (100000 at the least, as useradd starts):
    free in /etc/subuid and /etc/subgid alike, as usermod's advice must be."""
    return max([100000, *(first + count for ranges in tables for _, first, count in ranges)])


def doctor(config_file: str | None, slurm_conf: str | None = None, users: tuple[str, ...] = (),
           log=print) -> int:
    """Run every check, print one line each; 1 when any failed."""
    findings = Doctor(config_file, slurm_conf, users).run()
    for finding in findings:
        log(finding.line())
    failed = sum(f.status == FAIL for f in findings)
    log(f"{len(findings)} checks: {failed} failed" if failed else f"{len(findings)} checks: all ok"
        + (f" ({sum(f.status == WARN for f in findings)} warnings)" if any(f.status == WARN for f in findings) else ""))
    return 1 if failed else 0

#!/usr/bin/env python3
"""``make deb``: tether's wheel and its Debian package for the installed Slurm, into dist/.

    python3 tools/deb.py [--out DIR] [--version VERSION] [--wheel FILE] [--slurm-release RELEASE]

The package is ``tether-slurm<major>`` (``tether-slurm22.05`` on Debian 12): it Provides, Conflicts
with and Replaces the virtual package ``tether``, so one tether is installed at a time, and it
Depends on the exact Slurm release its plugins were built for (Slurm loads only plugins of its own
release; ``libslurm38 (>= 22.05.8), libslurm38 (<< 22.05.9~)``). Built with Debian's own tools, no
debhelper: the tree is staged here and ``dpkg-deb --build --root-owner-group`` packs it;
``dpkg-shlibdeps`` computes the shared-library dependencies.

What it holds (paths on the hosts):

    /usr/bin/tether                                   the command
    /usr/lib/python3/dist-packages/tether/            tether's Python code (the wheel's content), run by
                                                      Debian's python3 with Debian's python3-cffi-backend,
                                                      -yaml and -jinja2 (python3-aiohttp recommended)
    /usr/lib/<multiarch>/slurm-wlm/spank_tether.so    Slurm's PluginDir: both plugins, built by
    /usr/lib/<multiarch>/slurm-wlm/job_submit_tether.so  `tether slurm build` against /usr/bin/python3
    /usr/lib/<multiarch>/slurm-wlm/tether-run(-py)    the container launcher, for the default settings
    /etc/slurm/plugstack.conf.d/tether.conf           conffile: the SPANK line, commented out
    /lib/systemd/system/tether-serve.service          `tether serve`, not enabled
    /usr/share/man/man{1,5,8}/                        tether(1), tether.yaml(5), tether-spank(8)
    /usr/share/doc/<package>/                         copyright, changelog, examples/tether.yaml

The maintainer scripts are tools/debian/{postinst,prerm,postrm}. Nothing in the package writes
slurm.conf or plugstack.conf, and nothing is active until the admin says so.

The plugins embed Debian's /usr/bin/python3 (its libpython3.11, its stdlib and
/usr/lib/python3/dist-packages, fixed at build time): the package is built by running `tether slurm
build` with /usr/bin/python3 over the staged tree, and checked not to point into it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEBIAN = Path(__file__).resolve().parent / "debian"
SYSTEM_PYTHON = "/usr/bin/python3"
DIST_PACKAGES = "/usr/lib/python3/dist-packages"
DROPIN = "/etc/slurm/plugstack.conf.d/tether.conf"
UNIT = "/lib/systemd/system/tether-serve.service"   # bookworm's systemd unit directory
PACKAGED_STAMP = "/usr/lib/tether/slurm-build.json"  # tether.system.toolchain.PACKAGED_BUILD_STAMP
# what building needs, as Debian packages (the package's Build-Depends, had it a source package)
BUILD_NEEDS = ("gcc", "binutils", "python3-dev", "python3-cffi", "python3-yaml", "python3-jinja2", "libslurm-dev",
               "dpkg-dev")
RUNTIME_DEPENDS = ("python3-cffi-backend", "python3-yaml", "python3-jinja2")
RECOMMENDS = ("python3-aiohttp",)
SUGGESTS = ("gcc", "python3-cffi", "python3-dev", "libslurm-dev")  # rebuilding the plugins or tether-run
# what a wheel must not carry (copied source tree: nothing built, nothing of git's)
IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o", "*.pyc",
                                 ".pytest_cache", ".hypothesis")


# lintian's findings that are not: Jinja templates of shell scripts begin with #!, and a package built
# from a checkout closes no Debian bug
LINTIAN_OVERRIDES = """\
# Jinja templates of the launch scripts (rendered by tether, never run as they are)
script-not-executable [usr/lib/python3/dist-packages/tether/container/*.sh.j2]
shell-script-fails-syntax-check [usr/lib/python3/dist-packages/tether/container/*.sh.j2]
# built from a checkout by `make deb`, not uploaded to Debian
initial-upload-closes-no-bugs
"""


class DebError(Exception):
    """The package cannot be built here; the message says why."""


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``argv``; a failure raises DebError with what it printed."""
    result = subprocess.run(argv, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise DebError(f"{' '.join(map(str, argv))} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def missing_build_needs() -> list[str]:
    """The Debian packages of BUILD_NEEDS that are not installed."""
    missing = []
    for pkg in BUILD_NEEDS:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        if "install ok installed" not in status.stdout:
            missing.append(pkg)
    return missing


def project_version() -> str:
    """pyproject.toml's version."""
    m = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    if not m:
        raise DebError("no version in pyproject.toml")
    return m.group(1)


# the git queries the package's metadata comes from (its version, date, maintainer, changelog), answered
# on the host for a build in a Slurm root (no checkout there): TETHER_DEB_GIT_FACTS, JSON
GIT_QUERIES = (("log", "-1", "--format=%cd.%h", "--date=format-local:%Y%m%d%H%M%S"),
               ("status", "--porcelain", "--untracked-files=no"), ("log", "-1", "--format=%h %s"),
               ("log", "-1", "--format=%ct"), ("log", "-1", "--format=%an <%ae>"))
GIT_FACTS_ENV = "TETHER_DEB_GIT_FACTS"


def git(*args: str) -> str | None:
    """A git command's output in the checkout, or None (no git, no repository)."""
    if os.environ.get(GIT_FACTS_ENV):
        return json.loads(os.environ[GIT_FACTS_ENV]).get(" ".join(args))
    try:
        result = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def debian_version() -> str:
    """``<version>+git<commit time>.<commit>-1`` in a git checkout (later commits sort later, so
    installing an older .deb is a rollback dpkg names as a downgrade), else ``<version>-1``."""
    stamp = git("log", "-1", "--format=%cd.%h", "--date=format-local:%Y%m%d%H%M%S")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    upstream = project_version() + (f"+git{stamp}" if stamp else "") + (".dirty" if dirty else "")
    return upstream + "-1"


def build_wheel(out: Path, python: str) -> Path:
    """tether's wheel (``pip wheel --no-deps``) from a clean copy of the checkout, into ``out``."""
    with tempfile.TemporaryDirectory(prefix="tether-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(REPO, src, ignore=IGNORED)
        before = set(out.glob("tether-*.whl"))
        run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)])
    made = sorted(set(out.glob("tether-*.whl")) - before) or sorted(out.glob(f"tether-{project_version()}-*.whl"))
    if not made:
        raise DebError(f"pip wheel left no tether wheel in {out}")
    return made[-1]


def unpack_wheel(wheel: Path, target: Path) -> None:
    """The wheel's files into ``target`` (a site directory), without its RECORD (the byte-compiled
    files the postinst adds are not in it; dpkg's own list is the record)."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".dist-info/RECORD") or name.endswith("/"):
                continue
            dest = target / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(name))


def staged_python(site: Path, code: str) -> str:
    """Run ``code`` in Debian's python3 with tether imported from the staged ``site``; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TETHER_"))}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    return run([SYSTEM_PYTHON, "-c", code], env=env, cwd="/").stdout


def build_plugins(site: Path, out: Path) -> dict:
    """``tether slurm build`` (Debian's python3, the staged tether) into ``out``; its build.json."""
    code = ("import sys; from tether.cli.main import main; "
            f"sys.exit(main(['slurm', 'build', '--out', {str(out)!r}]))")
    staged_python(site, code)
    stamp = json.loads((out / "build.json").read_text())
    toolchain = stamp["toolchain"]
    leaked = [p for p in toolchain["module_paths"] if str(site) in p or p.startswith(str(REPO))]
    if toolchain["python_home"] != "/usr" or leaked or DIST_PACKAGES not in toolchain["module_paths"]:
        raise DebError(f"the plugins were built for another Python than Debian's: {toolchain}")
    return stamp


def slurm_library_package(version: str) -> str:
    """The Debian package of the libslurm the headers belong to (Debian 12: libslurm38)."""
    for link in sorted(Path("/usr/lib").glob("*/libslurm.so")) + [Path("/usr/lib/libslurm.so")]:
        if link.exists():
            owner = run(["dpkg-query", "-S", str(link.resolve())]).stdout.split(":")[0]
            shown = run(["dpkg-query", "-W", "-f=${Version}", owner]).stdout
            if not shown.startswith(version):
                raise DebError(f"{owner} is {shown}, but the headers are Slurm {version}")
            return owner
    raise DebError("libslurm.so was not found: install libslurm-dev (a Slurm not installed from Debian's "
                   "packages has no library package to depend on)")


def next_micro(version: str) -> str:
    major, minor, micro = version.split(".")
    return f"{major}.{minor}.{int(micro) + 1}~"


def write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)
    return path


def gzipped(data: bytes) -> bytes:
    """gzip -9n: no name, no time (reproducible)."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def dropin_text(plugin_dir: str, site: Path) -> str:
    """plugstack.conf.d/tether.conf: the SPANK line for the default settings, commented out."""
    line = staged_python(site, "from pathlib import Path; from tether.admin.slurm import plugstack_line; "
                               "from tether.hooks.config import default_config; "
                               f"print(plugstack_line(Path({plugin_dir!r}), default_config()))").strip()
    return ("# tether's SPANK plugin (from tether's Debian package; Debian's plugstack.conf includes this\n"
            "# directory). Inactive until you remove the '#' of the line below, on every host that runs\n"
            "# srun/sbatch/salloc or slurmd -- after creating job_storage_root (see `man tether-spank`).\n"
            "# The values are tether's defaults: `tether slurm install` prints the line for your\n"
            "# /etc/tether/tether.yaml; `tether doctor` checks it. Comment it out again before removing\n"
            "# the package.\n"
            f"#{line}\n")


def command_script() -> str:
    return (f"#!{SYSTEM_PYTHON}\n# tether's command (tether's Debian package)\nimport sys\n\n"
            "from tether.cli.main import main\n\nsys.exit(main())\n")


def copyright_text() -> str:
    return ("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
            "Upstream-Name: tether\n\nFiles: *\nCopyright: the tether authors\nLicense: Apache-2.0\n"
            " On Debian systems the full text of the Apache License 2.0 is in\n"
            " /usr/share/common-licenses/Apache-2.0.\n")


def changelog_text(package: str, version: str, maintainer: str) -> str:
    commit = git("log", "-1", "--format=%h %s") or "a checkout without git"
    when = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(int(git("log", "-1", "--format=%ct") or 0)))
    return (f"{package} ({version}) unstable; urgency=medium\n\n"
            f"  * Built from the checkout by `make deb`:\n    {commit[:70]}\n\n -- {maintainer}  {when}\n")


def shlib_depends(tmp: Path, files: list[Path]) -> list[str]:
    """dpkg-shlibdeps' shlibs:Depends for ``files`` (it wants a debian/control beside it)."""
    (tmp / "debian").mkdir(exist_ok=True)
    (tmp / "debian" / "control").touch()
    out = run(["dpkg-shlibdeps", "-O", *(f"-e{f}" for f in files)], cwd=tmp).stdout
    m = re.search(r"shlibs:Depends=(.*)", out)
    return [d.strip() for d in m.group(1).split(",")] if m else []


def build_deb(out: Path, wheel: Path, version: str | None = None) -> Path:
    """The Debian package for the installed Slurm from ``wheel``, into ``out``; its path."""
    missing = missing_build_needs()
    if missing:
        raise DebError(f"building the package needs these Debian packages: apt-get install {' '.join(missing)}")
    version = version or debian_version()
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    maintainer = git("log", "-1", "--format=%an <%ae>") or "tether maintainers <root@localhost>"
    with tempfile.TemporaryDirectory(prefix="tether-deb-") as tmpdir:
        tmp = Path(tmpdir)
        site_stage = tmp / "site"
        unpack_wheel(wheel, site_stage)
        stamp = build_plugins(site_stage, tmp / "plugins")
        slurm = stamp["toolchain"]["slurm_version"]
        major = ".".join(slurm.split(".")[:2])
        package = f"tether-slurm{major}"
        root = tmp / "debian" / package
        unpack_wheel(wheel, root / DIST_PACKAGES.lstrip("/"))
        plugin_dir = staged_python(site_stage, "from tether.system.toolchain import system_plugin_dir; "
                                               "print(system_plugin_dir())").strip()
        staged_plugins = root / plugin_dir.lstrip("/")
        staged_plugins.mkdir(parents=True)
        for name in stamp["files"]:
            shutil.copy2(tmp / "plugins" / name, staged_plugins / name)
        # what `tether slurm install` and `tether doctor` read on the host: the build, and where it is
        write(root / PACKAGED_STAMP.lstrip("/"), json.dumps({**stamp, "plugin_dir": plugin_dir}, indent=1) + "\n")
        # the container launcher for the default settings and a host without a config file; sys.path:
        # Debian's dist-packages (tether and its dependencies)
        staged_python(site_stage, "from pathlib import Path; from tether.admin.host import install_launcher; "
                                  "from tether.hooks.config import default_config; "
                                  f"install_launcher(Path({str(staged_plugins)!r}), default_config(), "
                                  f"installed_dir=Path({plugin_dir!r}), paths=[{DIST_PACKAGES!r}], "
                                  "bake_identity=False)")
        write(root / "usr/bin/tether", command_script(), 0o755)
        write(root / DROPIN.lstrip("/"), dropin_text(plugin_dir, site_stage))
        write(root / UNIT.lstrip("/"), (DEBIAN / "tether-serve.service").read_text().replace("@PACKAGE@", package))
        for page in sorted((REPO / "docs" / "man").glob("*.[1-8]")):
            write(root / f"usr/share/man/man{page.suffix[1:]}" / f"{page.name}.gz", gzipped(page.read_bytes()))
        doc = root / "usr/share/doc" / package
        write(doc / "copyright", copyright_text())
        write(root / "usr/share/lintian/overrides" / package, LINTIAN_OVERRIDES)
        write(doc / "changelog.Debian.gz", gzipped(changelog_text(package, version, maintainer).encode()))
        write(doc / "examples" / "tether.yaml",
              "# tether's defaults (`tether config show` without a config file): copy to /etc/tether/tether.yaml\n"
              "# and change what your site needs; `man tether.yaml` describes every key.\n"
              + staged_python(site_stage, "from tether.hooks.configfile import dump_yaml; "
                                          "from tether.hooks.config import default_config; "
                                          "print(dump_yaml(default_config()), end='')"))
        for dirpath, dirnames, filenames in os.walk(root):          # Debian's modes; nothing else writable
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for f in filenames:
                path = os.path.join(dirpath, f)
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
        binaries = [staged_plugins / n for n in (*stamp["files"], "tether-run")]
        static = [p for p in [staged_plugins / "tether-fd-receive"] if p.exists()]     # no shared libraries
        for binary in [*binaries, *static]:  # as dh_strip does (Debian policy 10.1): no debug info, no build paths
            run(["strip", "--remove-section=.comment", "--remove-section=.note", "--strip-unneeded", str(binary)])
        depends = [*shlib_depends(tmp, binaries),
                   f"{(lib := slurm_library_package(slurm))} (>= {slurm})", f"{lib} (<< {next_micro(slurm)})",
                   "python3 (>= 3.11)", *RUNTIME_DEPENDS]
        control_dir = root / "DEBIAN"
        control_dir.mkdir()
        md5 = []
        size = 0
        for dirpath, _, filenames in sorted(os.walk(root)):
            if Path(dirpath).is_relative_to(control_dir):
                continue
            for f in sorted(filenames):
                path = Path(dirpath, f)
                size += path.stat().st_size
                if not str(path.relative_to(root)).startswith("etc/"):
                    md5.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {path.relative_to(root)}\n")
        write(control_dir / "md5sums", "".join(md5))
        write(control_dir / "conffiles", DROPIN + "\n")
        for script in ("postinst", "prerm", "postrm"):
            write(control_dir / script, (DEBIAN / script).read_text().replace("@PACKAGE@", package), 0o755)
        write(control_dir / "control", "".join(f"{k}: {v}\n" for k, v in (
            ("Package", package),
            ("Version", version),
            ("Architecture", arch),
            ("Maintainer", maintainer),
            ("Installed-Size", str((size + 1023) // 1024)),
            ("Depends", ", ".join(dict.fromkeys(depends))),
            ("Recommends", ", ".join(RECOMMENDS)),
            ("Suggests", ", ".join(SUGGESTS)),
            ("Conflicts", "tether"),
            ("Replaces", "tether"),
            ("Provides", "tether"),
            ("Section", "admin"),
            ("Priority", "optional"),
            ("Description", f"Slurm plugins for slots, per-rank setup and containers (Slurm {major})\n"
                            f" tether turns a request for slots into the GPU/CPU resources Slurm needs,\n"
                            f" sets up per-rank directories and environment, and runs each rank in a container\n"
                            f" (Podman, Apptainer, Singularity, Enroot) while Slurm still owns every process.\n"
                            f" .\n"
                            f" This package holds tether's SPANK and job_submit plugins built for Slurm\n"
                            f" {slurm}, its container launcher, the tether command and the tether serve\n"
                            f" unit. Nothing is active until the admin names the plugins in slurm.conf and\n"
                            f" plugstack.conf (see /etc/slurm/plugstack.conf.d/tether.conf)."),
        )))
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"{package}_{version.split(':')[-1]}_{arch}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
            env={**os.environ, "SOURCE_DATE_EPOCH": git("log", "-1", "--format=%ct") or "0"})
    return deb


def build_in_slurm_root(out: Path, wheel: Path, release: str, version: str) -> Path:
    """The package for another Slurm release (``24.11``), built the same way inside that release's
    Debian root (the sandbox's, tether.sandbox.slurmroot: built and cached on first use): this
    script, the wheel and the manual pages are staged in the root, run there with its Debian
    Python, Slurm and dpkg, and the .deb copied out into ``out``."""
    try:
        from tether.sandbox.slurmroot import SlurmRoot, SlurmRootError
        from tether.system.proc import CommandError
    except ImportError:
        raise DebError("--slurm-release needs tether installed in the Python running this script "
                       "(make install's /opt/tether/venv)") from None
    try:
        root = SlurmRoot(release)
        root.ensure(log=lambda m: print(f"tools/deb.py: {m}", file=sys.stderr))
        stage_in_root = f"/root/tether-deb-{os.getpid()}"       # root's home in the root (0700), not its /var/tmp
        stage = root.path / stage_in_root.lstrip("/")
        shutil.rmtree(stage, ignore_errors=True)
        try:
            shutil.copytree(Path(__file__).resolve().parent, stage / "tools", ignore=IGNORED)
            shutil.copytree(REPO / "docs" / "man", stage / "docs" / "man")
            shutil.copy(REPO / "pyproject.toml", stage / "pyproject.toml")
            shutil.copy(wheel, stage / wheel.name)
            facts = json.dumps({" ".join(query): git(*query) for query in GIT_QUERIES})
            made = root.run(["python3", f"{stage_in_root}/tools/deb.py", "--wheel", f"{stage_in_root}/{wheel.name}",
                             "--out", f"{stage_in_root}/out", "--version", version], env={GIT_FACTS_ENV: facts},
                            timeout=900)
            deb = Path(made.stdout.split()[-1]).name
            shutil.copy(stage / "out" / deb, out / deb)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except (SlurmRootError, CommandError) as exc:
        raise DebError(f"building the package for Slurm {release} in its Debian root: {exc}") from None
    return out / deb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/deb.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "dist"), help="where the wheel and the .deb go (default dist/)")
    parser.add_argument("--version", help="the Debian version (default <version>+git<commit time>.<commit>-1)")
    parser.add_argument("--wheel-python", default=sys.executable,
                        help="the Python whose pip builds the wheel (default: this one)")
    parser.add_argument("--wheel", metavar="FILE", help="package this wheel of tether instead of building one")
    parser.add_argument("--slurm-release", metavar="RELEASE",
                        help="build for another Slurm release (24.11, 26.05) in its Debian root (the sandbox's)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        wheel = Path(args.wheel).resolve() if args.wheel else build_wheel(out, args.wheel_python)
        if args.slurm_release:
            deb = build_in_slurm_root(out, wheel, args.slurm_release, args.version or debian_version())
        else:
            deb = build_deb(out, wheel, args.version)
    except DebError as exc:
        print(f"tools/deb.py: {exc}", file=sys.stderr)
        return 1
    print(f"{wheel}\n{deb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

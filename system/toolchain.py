"""Compiling tether's C against the installed Slurm and a Python every job user can read.

Shared by the builds of the SPANK plugin, the job_submit plugin and tether-jobdirs (``tether slurm
build``, ``tether pbs install``). The facts it enforces come from the design notes: build against
the exact installed Slurm headers (plugins are checked to the micro release), embed a libpython that
every job user can read (Debian's), fix the interpreter's search paths at build time, link
``-z nodelete`` (slurmctld dlcloses plugins while Python still points into them) and
``--disable-new-dtags``, and install with a new inode.

tether's own C files are compiled here, each on its own, with ``-Wall -Wextra`` into object files
(once per build, whatever links them); cffi compiles only the glue it generates and links those
objects in. Everything is built hardened as pyxis builds its plugin: ``_FORTIFY_SOURCE=2``, the
stack protector, full RELRO (``-z relro -z now``), and a plugin exports only the entry points
Slurm looks up (a version script). ``-Werror`` is added only where ``TETHER_WERROR=1`` (the test
run and CI): a site's compiler that warns about something new must not stop its install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from ..hooks.errors import TetherError
from .files import install_file, world_readable
from .proc import CommandError, run_command

SLURM_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")
# -U first: a compiler that defines _FORTIFY_SOURCE itself (Ubuntu's) would warn of a redefinition
HARDENING = ("-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong")
CFLAGS = ("-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", *HARDENING)
LDFLAGS = ("-Wl,-z,relro,-z,now",)
WERROR_ENV = "TETHER_WERROR"


def cflags() -> tuple[str, ...]:
    """The flags tether's C is compiled with: ``CFLAGS``, plus ``-Werror`` where ``TETHER_WERROR=1``
    (the test run and CI; never a site's install)."""
    return (*CFLAGS, "-Werror") if os.environ.get(WERROR_ENV) == "1" else CFLAGS


def version_script(directory: Path, exports: Sequence[str]) -> Path:
    """A linker version script in ``directory`` that exports ``exports`` (names or globs such as
    ``slurm_spank_*``) and binds everything else locally."""
    path = Path(directory) / "exports.map"
    path.write_text("{\n  global:\n" + "".join(f"    {name};\n" for name in exports) + "  local:\n    *;\n};\n")
    return path


class BuildError(TetherError):
    """The plugins cannot be built or installed here; the message says what is missing."""


@dataclass(frozen=True)
class Toolchain:
    """What the plugins are built against."""

    slurm_version: str                # "22.05.8", from slurm_version.h
    slurm_version_number: int         # SLURM_VERSION_NUMBER
    include_dir: str                  # the directory holding slurm/slurm.h
    python_include: str
    libpython: str                    # the shared libpython the plugins embed
    python_lib_name: str              # "python3.11" (for -l)
    python_home: str                  # sys.base_prefix of that Python
    module_paths: tuple[str, ...]     # sys.path for the embedded interpreter (tether importable)


def slurm_headers() -> tuple[str, str, int]:
    """(include dir, version text, SLURM_VERSION_NUMBER) of the installed Slurm headers."""
    include_dir = next((d for d in SLURM_INCLUDE_DIRS if Path(d, "slurm", "slurm.h").exists()), None)
    if include_dir is None:
        raise BuildError("Slurm's headers (slurm/slurm.h) were not found: install libslurm-dev "
                         "(Debian) or your Slurm's development package")
    version_h = Path(include_dir, "slurm", "slurm_version.h").read_text()
    m_num = re.search(r"#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", version_h)
    if not m_num:
        raise BuildError(f"cannot read the Slurm version from {include_dir}/slurm/slurm_version.h")
    number = int(m_num.group(1), 16)
    return include_dir, f"{number >> 16:02d}.{(number >> 8) & 0xff:02d}.{number & 0xff}", number


def find_toolchain() -> Toolchain:
    """Locate Slurm's headers and a suitable libpython; raise BuildError naming what is missing."""
    include_dir, version, number = slurm_headers()
    installed = installed_slurm_version()
    if installed and installed != version:
        raise BuildError(f"Slurm headers are {version} but the installed Slurm is {installed}; "
                         f"install the matching libslurm-dev (plugins must match to the micro release)")
    python_include = sysconfig.get_paths()["include"]
    if not Path(python_include, "Python.h").exists():
        raise BuildError(f"Python.h not found in {python_include}: install python3-dev")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    libpython = Path(libdir, soname)
    if not soname.endswith(tuple(f".so{s}" for s in ("", ".1.0"))) or not libpython.exists():
        raise BuildError(f"no shared libpython for {sys.executable} (looked for {libpython}); build "
                         f"with Debian's python3 (tests/bootstrap creates /opt/tether/venv from it)")
    paths = sysconfig.get_paths()
    candidates = [paths["stdlib"], sysconfig.get_config_var("DESTSHARED"), paths["purelib"], paths["platlib"],
                  *dependency_dirs()]
    module_paths = tuple(dict.fromkeys(p for p in candidates if p and os.path.isdir(p)))
    unreadable = [p for p in (libpython, Path(python_include), *map(Path, module_paths)) if not world_readable(p)]
    if unreadable:
        raise BuildError("the embedded Python must be readable by every job user, but these are not: "
                         + ", ".join(map(str, unreadable))
                         + "; use Debian's /usr/bin/python3 and a venv outside /root (tests/bootstrap)")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    lib_name = ldlib.removeprefix("lib").split(".so")[0] or f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return Toolchain(version, number, include_dir, python_include, str(libpython), lib_name,
                     sys.base_prefix, module_paths)


def dependency_dirs() -> list[str]:
    """Where this Python imports tether's runtime dependencies from: with Debian's own python3 and
    its python3-cffi/-yaml/-jinja2 that is /usr/lib/python3/dist-packages, which only Debian's
    site.py adds (sysconfig does not name it), and the embedded interpreter must find them too."""
    import importlib.util

    found = []
    for name in ("_cffi_backend", "yaml", "jinja2"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if origin:
            found.append(str(Path(origin).parent if spec.submodule_search_locations is None
                             else Path(origin).parent.parent))
    return found


def installed_slurm_version() -> str | None:
    """The version slurmctld/srun report (None when neither is installed)."""
    for binary in ("slurmctld", "srun"):
        try:
            out = run_command([binary, "-V"], timeout=10).stdout
        except CommandError:
            continue
        m = re.search(r"(\d+\.\d+\.\d+)", out)
        if m:
            return m.group(1)
    return None


def system_plugin_dir() -> str:
    """Debian's Slurm PluginDir (``/usr/lib/<multiarch>/slurm-wlm``)."""
    candidates = sorted(Path("/usr/lib").glob("*/slurm-wlm")) + [Path("/usr/lib/slurm-wlm")]
    for path in candidates:
        if (path / "select_cons_tres.so").exists():
            return str(path)
    raise BuildError("Slurm's plugins were not found under /usr/lib/*/slurm-wlm; is slurm-wlm installed?")


def c_string(text: str) -> str:
    """A C string literal for ``text`` (ASCII-safe)."""
    return json.dumps(text, ensure_ascii=True)


def define(name: str, value: str | int) -> str:
    """A ``-D`` argument (argv, no shell): strings as C string literals."""
    return f"-D{name}={c_string(value) if isinstance(value, str) else value}"


def _gcc(argv: list[str], what: str, verbose: bool) -> None:
    try:
        result = run_command(argv, timeout=300)
    except CommandError as exc:
        raise BuildError(f"compiling {what} failed: {exc}") from None
    if verbose:
        print(" ".join(argv) + "\n" + result.stderr, end="")


class CBuild:
    """Object files compiled once per build directory (``<out>/obj``) and the targets linked from
    them. An object is compiled again only when its source, the headers next to it or its flags
    changed (a digest in its name)."""

    def __init__(self, out_dir: Path, *, verbose: bool = False):
        self.obj_dir = Path(out_dir) / "obj"
        self.verbose = verbose

    def compile(self, source: Path, *, include_dirs: Sequence[str] = (), defines: Sequence[str] = (),
                header_dirs: Sequence[Path] = ()) -> Path:
        """``source`` as an object file (``cflags()``); its path. It is compiled again when a header
        next to it or in ``header_dirs`` changed."""
        source = Path(source)
        flags = [*cflags(), *(f"-I{d}" for d in (source.parent, *include_dirs)), *defines]
        digest = hashlib.sha256(source.read_bytes() + repr(flags).encode())
        for header in [h for d in (source.parent, *header_dirs) for h in sorted(Path(d).glob("*.h"))]:
            digest.update(header.read_bytes())
        obj = self.obj_dir / f"{source.stem}-{digest.hexdigest()[:16]}.o"
        if not obj.exists():
            self.obj_dir.mkdir(parents=True, exist_ok=True)
            tmp = obj.with_suffix(f".{os.getpid()}.tmp")
            _gcc(["gcc", *flags, "-c", str(source), "-o", str(tmp)], source.name, self.verbose)
            os.replace(tmp, obj)
        return obj

    def link(self, objects: Sequence[Path], target: Path, *, shared: bool = False,
             link_args: Sequence[str] = (), exports: Sequence[str] | None = None) -> Path:
        """Link ``objects`` into ``target`` (a program, or with ``shared`` a shared object), installed
        with mode 755 and a new inode (a running copy keeps the old one). ``exports``: the only
        dynamic symbols a shared object defines (see ``version_script``)."""
        with tempfile.TemporaryDirectory(prefix="tether-build-") as tmp:
            out = Path(tmp) / target.name
            script = [f"-Wl,--version-script={version_script(Path(tmp), exports)}"] if exports is not None else []
            argv = ["gcc", *(["-shared"] if shared else []), *map(str, objects), "-o", str(out), *LDFLAGS,
                    *script, *link_args]
            _gcc(argv, target.name, self.verbose)
            install_file(out, target)
        return target


def compile_cffi_plugin(*, module: str, glue: str, cdef: str, embedding_api: str, init_code: str,
                        objects: Sequence[Path], include_dirs: Sequence[str], target: Path,
                        toolchain: Toolchain, exports: Sequence[str], verbose: bool = False) -> Path:
    """A cffi embedding module that is also a Slurm plugin: cffi compiles its generated glue (with
    ``glue`` as the source prefix) and links tether's ``objects`` and libpython into ``target``,
    which exports only ``exports``. Nothing of cffi's needs exporting: its module's init function
    and the ``extern "Python"`` functions are called from inside the object, never looked up."""
    import cffi  # imported here: only the build needs the compiler side of cffi

    with tempfile.TemporaryDirectory(prefix=f"tether-build-{module}-") as tmp:
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        ffi.embedding_api(embedding_api)
        ffi.set_source(
            module, glue,
            include_dirs=[toolchain.include_dir, *include_dirs],
            libraries=[toolchain.python_lib_name, "dl", "pthread"],
            library_dirs=[str(Path(toolchain.libpython).parent)],
            extra_objects=[str(o) for o in objects],
            extra_compile_args=["-O2", "-fvisibility=default", *HARDENING],
            extra_link_args=["-Wl,-z,nodelete", "-Wl,--disable-new-dtags", *LDFLAGS,
                             f"-Wl,--version-script={version_script(Path(tmp), exports)}"],
        )
        ffi.embedding_init_code(init_code)
        try:
            built = ffi.compile(tmpdir=tmp, target=str(Path(tmp) / target.name), verbose=verbose)
        except Exception as exc:  # cffi raises VerificationError/CompileError with the compiler's text
            raise BuildError(f"compiling {target.name} failed: {exc}") from None
        install_file(Path(built), target)
    return target


def write_stamp(out_dir: Path, toolchain: Toolchain, files: Sequence[Path], **extra: str) -> Path:
    """Record what the plugins were built against (checked again at install)."""
    stamp = out_dir / "build.json"
    stamp.write_text(json.dumps({"toolchain": asdict(toolchain), "files": [f.name for f in files],
                                 **extra}, indent=2) + "\n")
    return stamp


# tether's Debian package records the build of the plugins it ships here (tools/deb.py): the same
# build.json, plus "plugin_dir", where the package put them
PACKAGED_BUILD_STAMP = "/usr/lib/tether/slurm-build.json"


def packaged_stamp(path: str = PACKAGED_BUILD_STAMP) -> dict | None:
    """The build stamp of the plugins tether's Debian package installed, or None (no package)."""
    try:
        stamp = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("plugin_dir") and stamp.get("files") else None


def read_stamp(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / "build.json").read_text())
    except (OSError, ValueError):
        raise BuildError(f"{out_dir} holds no tether plugin build (build.json missing): "
                         f"run `tether slurm build` first") from None


def tether_import_path() -> str:
    """The directory ``tether`` is imported from (this file is <there>/tether/system/toolchain.py):
    what the sys.path of an interpreter tether starts elsewhere (the launcher, pbs_python) needs."""
    return str(Path(__file__).resolve().parents[2])

"""Building tether's C shims with cffi against the installed Slurm and a Python every user can read.

Shared by the SPANK plugin and the job_submit plugin builds (``tether slurm build``). The facts it
enforces come from ../shared/DESIGN.md: build against the exact installed Slurm headers (plugins are
checked to the micro release), embed a libpython that every job user can read (Debian's), fix the
interpreter's search paths at build time, link ``-z nodelete`` (slurmctld dlcloses plugins while
Python still points into them) and ``--disable-new-dtags``, and install with a new inode.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from .errors import TetherError
from .proc import CommandError, run_command

SLURM_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")


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


def find_toolchain() -> Toolchain:
    """Locate Slurm's headers and a suitable libpython; raise BuildError naming what is missing."""
    include_dir = next((d for d in SLURM_INCLUDE_DIRS if Path(d, "slurm", "slurm.h").exists()), None)
    if include_dir is None:
        raise BuildError("Slurm's headers (slurm/slurm.h) were not found: install libslurm-dev "
                         "(Debian) or your Slurm's development package")
    version_h = Path(include_dir, "slurm", "slurm_version.h").read_text()
    m_num = re.search(r"#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", version_h)
    if not m_num:
        raise BuildError(f"cannot read the Slurm version from {include_dir}/slurm/slurm_version.h")
    number = int(m_num.group(1), 16)
    version = f"{number >> 16:02d}.{(number >> 8) & 0xff:02d}.{number & 0xff}"
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
    unreadable = [p for p in (libpython, Path(python_include)) if not world_readable(p)]
    paths = sysconfig.get_paths()
    candidates = [paths["stdlib"], sysconfig.get_config_var("DESTSHARED"), paths["purelib"], paths["platlib"]]
    module_paths = tuple(dict.fromkeys(p for p in candidates if p and os.path.isdir(p)))
    unreadable += [Path(p) for p in module_paths if not world_readable(Path(p))]
    if unreadable:
        raise BuildError("the embedded Python must be readable by every job user, but these are not: "
                         + ", ".join(map(str, unreadable))
                         + "; use Debian's /usr/bin/python3 and a venv outside /root (tests/bootstrap)")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    lib_name = ldlib.removeprefix("lib").split(".so")[0] or f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return Toolchain(version, number, include_dir, python_include, str(libpython), lib_name,
                     sys.base_prefix, module_paths)


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


def world_readable(path: Path) -> bool:
    """True if other users can read ``path`` and traverse every directory above it."""
    path = Path(path).resolve()
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
    if mode & need != need:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


def c_string(text: str) -> str:
    """A C string literal for ``text`` (ASCII-safe)."""
    return json.dumps(text, ensure_ascii=True)


def compile_plugin(*, module: str, source: str, target: Path, toolchain: Toolchain,
                   cdef: str = "", embedding_api: str | None = None,
                   init_code: str | None = None, verbose: bool = False) -> Path:
    """Compile a cffi module that is also a Slurm plugin, to ``target`` (a .so path)."""
    import cffi  # imported here: only the build needs the compiler side of cffi

    ffi = cffi.FFI()
    if cdef:
        ffi.cdef(cdef)
    if embedding_api:
        ffi.embedding_api(embedding_api)
    ffi.set_source(
        module, source,
        include_dirs=[toolchain.include_dir],
        libraries=[toolchain.python_lib_name, "dl"],
        library_dirs=[str(Path(toolchain.libpython).parent)],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-function", "-Wno-unused-variable",
                            "-fvisibility=default"],
        extra_link_args=["-Wl,-z,nodelete", "-Wl,--disable-new-dtags", "-Wl,-z,now"],
    )
    if init_code is not None:
        ffi.embedding_init_code(init_code)
    with tempfile.TemporaryDirectory(prefix=f"tether-build-{module}-") as tmp:
        try:
            built = ffi.compile(tmpdir=tmp, target=str(Path(tmp) / target.name), verbose=verbose)
        except Exception as exc:  # cffi raises VerificationError/CompileError with the compiler's text
            raise BuildError(f"compiling {target.name} failed: {exc}") from None
        install_file(Path(built), target)
    return target


def compile_c_plugin(*, source: str, target: Path, toolchain: Toolchain, verbose: bool = False) -> Path:
    """Compile a plain C Slurm plugin (no Python in it) with the system compiler to ``target``.

    Used for the SPANK plugin: srun, sbatch and every slurmstepd load it, and linking libpython
    into it costs every step several milliseconds even when no Python runs (bench/step.py)."""
    return compile_c(source=source, target=target, verbose=verbose,
                     args=["-fPIC", "-shared", f"-I{toolchain.include_dir}", "-Wl,-z,nodelete", "-Wl,-z,now"])


def compile_c(*, source: str, target: Path, args: Sequence[str] = (), verbose: bool = False) -> Path:
    """Compile C ``source`` with gcc (-O2 -Wall -Werror plus ``args``) to ``target``, mode 755 and a
    new inode (a running copy keeps the old one): a program unless ``args`` ask for a shared object."""
    with tempfile.TemporaryDirectory(prefix="tether-build-") as tmp:
        src = Path(tmp) / (target.stem + ".c")
        src.write_text(source)
        out = Path(tmp) / target.name
        argv = ["gcc", "-O2", "-Wall", "-Werror", *args, "-o", str(out), str(src)]
        try:
            result = run_command(argv, timeout=300)
        except CommandError as exc:
            raise BuildError(f"compiling {target.name} failed: {exc}") from None
        if verbose:
            print(" ".join(argv) + "\n" + result.stderr, end="")
        install_file(out, target)
    return target


def write_stamp(out_dir: Path, toolchain: Toolchain, files: Sequence[Path], **extra: str) -> Path:
    """Record what the plugins were built against (checked again at install)."""
    stamp = out_dir / "build.json"
    stamp.write_text(json.dumps({"toolchain": asdict(toolchain), "files": [f.name for f in files],
                                 **extra}, indent=2) + "\n")
    return stamp


def read_stamp(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / "build.json").read_text())
    except (OSError, ValueError):
        raise BuildError(f"{out_dir} holds no tether plugin build (build.json missing): "
                         f"run `tether slurm build` first") from None


def write_atomic(dest: Path, data: bytes | str, mode: int) -> None:
    """Write ``dest`` whole or not at all: a temporary file beside it, then a rename (a new inode, so
    a process that has the old file loaded or open keeps it)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_file(src: Path, dest: Path) -> None:
    """Install ``src`` as ``dest`` with mode 755 and a new inode (never overwrite a loaded .so)."""
    write_atomic(dest, Path(src).read_bytes(), 0o755)


def tether_import_path() -> str:
    """The directory ``tether`` is imported from: what the sys.path of an interpreter tether starts
    elsewhere (the container launcher, PBS's pbs_python) needs."""
    import tether

    return os.path.dirname(os.path.abspath(next(iter(tether.__path__))))


def set_conf_line(path: Path, pattern: str, line: str | None) -> None:
    """Replace the line matching ``pattern`` (at line start, case-insensitive) or append ``line``;
    the file is rewritten atomically and keeps its mode. ``line=None`` removes matching lines."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        text, mode = "", 0o644
    lines = text.splitlines()
    rx = re.compile(r"\s*" + pattern, re.I)
    hits = [i for i, existing in enumerate(lines) if rx.match(existing)]
    for i in reversed(hits[1:] if line is not None else hits):
        del lines[i]
    if line is not None:
        if hits:
            lines[hits[0]] = line
        else:
            lines.append(line)
    write_atomic(path, "\n".join(lines) + "\n", mode)

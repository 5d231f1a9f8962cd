"""Fake ``apptainer``, ``singularity`` and ``enroot`` that check what the real ones check.

No package archive here has them, so tether's launcher is tested against these. Each knows the
flags of one real version and refuses any other with that version's message; each computes the
environment the containerized program would see by the documented rules and records it with the
call (``<state>/calls.jsonl``: argv, the runtime's own environment, ``container_env``, ``cwd``;
enroot records each call as ``enroot`` and, for a container it starts, an ``enroot-container``
entry with what the program sees).
What a fake then does is up to the test (``<state>/behaviour.json``): exit with ``exit_code``
(default 0), or ``run`` the command on the host with the container's environment.

Sources, per behaviour:
- Apptainer / SingularityCE flags: ``cmd/internal/cli/action_flags.go`` of SingularityCE 3.4.2
  (no ``--rocm``, ``--env``, ``--env-file``), 3.5.3 (``--rocm``), 3.6.0 (``--env``, ``--env-file``);
  Apptainer 1.x has all of them. An unknown flag: ``Error for command "exec": unknown flag: --env``
  followed by the command's options, exit 1 (``cmd/internal/cli/singularity.go``, ExecuteSingularity).
  Flags end at the image: pflag does not intersperse for action commands.
- Their environment (Apptainer docs, "Environment and Metadata"; ``internal/pkg/util/env/create.go``):
  ``--cleanenv`` drops the host's variables but ``TERM`` and the proxies and sets ``LANG=C``;
  ``<PREFIX>ENV_NAME=v`` sets NAME inside (``APPTAINERENV_``; ``SINGULARITYENV_`` for Singularity
  and, deprecated, for Apptainer; ``HOME`` refused with a warning, ``PATH``/``PREPEND_PATH``/
  ``APPEND_PATH`` change PATH); ``HOME`` is the user's, ``PATH`` the default; ``--env NAME=v`` sets
  NAME and wins over the prefixed variables.
- A missing image: ``FATAL:   could not open image IMG: failed to retrieve path for IMG: lstat IMG:
  no such file or directory``, exit 255.
- A squashfs image file (recorded with Apptainer 1.1.9 built from its sources, by hand:
  ``tests/fixtures/conformance/apptainer-squashfs.json``): zstd is refused before anything runs
  (``FATAL:   could not open image IMG: corrupted image: unknown compression algorithm value 6``,
  exit 255); a gzip one runs, its ``/.singularity.d/env/*.sh`` sourced over the environment
  above before PATH's changes (run here by sh for real), with ``INFO:    fuse2fs not found, will
  not be able to mount EXT3 filesystems`` on each run where no fuse2fs is installed.
- Enroot 4.1.2 (``enroot.in``): the defaults of its paths (``ENROOT_RUNTIME_PATH`` =
  ``${XDG_RUNTIME_DIR:-/run}/enroot``, cache/data under ``XDG_CACHE_HOME``/``XDG_DATA_HOME``, temp
  ``${TMPDIR:-/tmp}``), then ``(umask 077 && mkdir -p CACHE DATA RUNTIME)`` before any command -- done
  here for real, as the calling user, so an unwritable default fails as it does in a Slurm task:
  ``mkdir: cannot create directory '/run/enroot': Permission denied``; each command's option loop
  (an unknown ``-?*`` prints the command's usage and exits 1); ``src/runtime.sh``: create refuses an
  existing name ("File already exists: ..."), a file that is not squashfs ("Invalid image format"),
  a name with '/'; start needs an existing container ("No such file or directory: ...") and checks
  ``--env`` names and ``--mount`` specs ("Invalid argument: ..."), and a ``--conf`` script (a
  regular file after realpath, ``bash -n`` clean); the container's environment is built as
  ``runtime::_do_environ`` builds it -- the image's ``/etc/environment``, the script's ``environ()``
  (run here by bash for real), the ``--env`` items (``NAME`` alone: its value in enroot's own
  environment, empty when unset) -- formatted twice by ``common::envfmt`` and loaded by
  enroot-switchroot (``clearenv``, then each valid line, the last one winning; then ``TERM``,
  ``HOME``, ``SHELL``, ``USER``, ``LOGNAME`` and ``PATH`` where still unset). A squashfs file
  started as it is (``enroot start FILE``; runtime.sh's _mount_rootfs): a file unsquashfs cannot
  read is "Invalid argument", ``squashfuse`` and ``mountpoint`` must be there (``fuse-overlayfs``
  too with ENROOT_NATIVE_OVERLAYFS off), /dev/fuse is opened as the user ("[WARN] fuse: failed to
  open /dev/fuse: Permission denied" / "Failed to mount"), and a stopped "fuse shim" is left in a
  process group of its own until the SIGHUP of that group -- as recorded from real enroot 4.1.2
  (tests/fixtures/conformance/enroot.json, start-sqsh-*; enroot-start-image.json, by hand).

"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .fakebin import FakeCommands, UsageError, install_fakes, record_call, run_main

SQUASHFS_MAGIC = b"hsqs"      # the first four bytes of every squashfs image (what unsquashfs -s checks)

# ---- Apptainer / Singularity -------------------------------------------------------------------
_VALUE_FLAGS_34 = {"app", "bind", "home", "overlay", "scratch", "workdir", "pwd", "hostname", "network",
                   "network-args", "dns", "security", "apply-cgroups", "vm-ram", "vm-cpu", "vm-ip",
                   "containlibs", "passphrase", "pem-path", "fusemount", "docker-username", "docker-password",
                   "tmpdir", "add-caps", "drop-caps"}
_BOOL_FLAGS_34 = {"disable-cache", "shell", "nonet", "boot", "fakeroot", "cleanenv", "contain", "containall",
                  "nv", "writable", "writable-tmpfs", "no-home", "no-init", "nohttps", "docker-login", "no-nv",
                  "vm", "vm-err", "syos", "pid", "ipc", "net", "uts", "userns", "keep-privs", "no-privs",
                  "allow-setuid"}
_SHORTHANDS = {"B": "bind", "H": "home", "o": "overlay", "S": "scratch", "W": "workdir", "e": "cleanenv",
               "c": "contain", "C": "containall", "w": "writable", "u": "userns", "f": "fakeroot", "p": "pid",
               "i": "ipc", "n": "net"}


def _profile(value_flags: set, bool_flags: set, version: str, prog: str, prefixes: tuple[str, ...],
             clean_lang_forced: bool = False) -> dict:
    """``clean_lang_forced``: --cleanenv leaves LANG=C whatever <PREFIX>LANG says (recorded on
    SingularityCE 3.4.2: conformance cases cleanenv-*LANG*, tests/fixtures/conformance)."""
    return {"value": value_flags, "bool": bool_flags, "version": version, "prog": prog, "prefixes": prefixes,
            "clean_lang_forced": clean_lang_forced}


PROFILES = {
    "singularity-3.4": _profile(_VALUE_FLAGS_34, _BOOL_FLAGS_34, "singularity version 3.4.2-1", "singularity",
                                ("SINGULARITYENV_",), clean_lang_forced=True),
    "singularity-3.5": _profile(_VALUE_FLAGS_34, _BOOL_FLAGS_34 | {"rocm", "no-rocm"},
                                "singularity version 3.5.3-1", "singularity", ("SINGULARITYENV_",)),
    "singularity-3.6": _profile(_VALUE_FLAGS_34 | {"env", "env-file"}, _BOOL_FLAGS_34 | {"rocm", "no-rocm"},
                                "singularity version 3.6.0-1", "singularity", ("SINGULARITYENV_",)),
    "singularity-4": _profile(_VALUE_FLAGS_34 | {"env", "env-file", "mount"},
                              _BOOL_FLAGS_34 | {"rocm", "no-rocm", "nvccli", "no-mount", "unsquash", "compat",
                                                "no-eval", "no-umask", "no-https"},
                              "singularity-ce version 4.1.0", "singularity", ("SINGULARITYENV_",)),
    "apptainer-1": _profile(_VALUE_FLAGS_34 | {"env", "env-file", "mount"},
                            _BOOL_FLAGS_34 | {"rocm", "no-rocm", "nvccli", "no-mount", "unsquash", "compat",
                                              "no-eval", "no-umask", "no-https"},
                            "apptainer version 1.2.5", "apptainer", ("APPTAINERENV_", "SINGULARITYENV_")),
}
_GLOBAL_FLAGS = {"debug", "quiet", "silent", "verbose", "nocolor"}
_GLOBAL_SHORT = {"d": "debug", "q": "quiet", "s": "silent", "v": "verbose"}


def _pflag(command: str, argv: list[str], values: set, bools: set) -> tuple[dict[str, list[str]], list[str]]:
    """pflag with interspersing off: flags until the first operand; ``--f v``, ``--f=v``, ``-B v``."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return flags, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return flags, argv[i:]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
        else:
            letter, value = arg[1:2], arg[2:]
            name, eq = _SHORTHANDS.get(letter, ""), "=" if value else ""
            if not name or (name not in values and name not in bools):
                raise UsageError(f'Error for command "{command}": unknown shorthand flag: \'{letter}\' in {arg}')
        if name in bools:
            flags.setdefault(name, []).append(value if eq else "true")
        elif name in values:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f'Error for command "{command}": flag needs an argument: --{name}')
                i += 1
                value = argv[i]
            flags.setdefault(name, []).append(value)
        else:
            raise UsageError(f'Error for command "{command}": unknown flag: --{name}\n\n'
                             f"Options for {command} command:\n\n  (the flags of this version)")
        i += 1
    return flags, []


def apptainer_main(profile_name: str, argv: list[str], state: str) -> int:
    profile = PROFILES[profile_name]
    prog = profile["prog"]
    i = 0
    while i < len(argv) and argv[i].startswith("-"):       # global flags
        flag = argv[i].lstrip("-")
        if argv[i] == "--version":
            print(profile["version"])
            return 0
        if flag not in _GLOBAL_FLAGS and _GLOBAL_SHORT.get(flag) is None:
            raise UsageError(f'Error for command "{prog}": unknown flag: {argv[i]}')
        i += 1
    if i >= len(argv):
        raise UsageError(f"Usage:\n  {prog} [global options...]")
    command, args = argv[i], argv[i + 1:]
    if command == "version":
        print(profile["version"].split()[-1])
        return 0
    if command == "build":
        return _apptainer_build(prog, args, state)
    if command not in ("exec", "run"):
        raise UsageError(f'Error for command "{prog}": unknown command "{command}" for "{prog}"')
    flags, operands = _pflag(command, args, profile["value"], profile["bool"])
    # exec: Args cobra.MinimumNArgs(2); run: cobra.MinimumNArgs(1) (cmd/internal/cli/actions.go)
    if len(operands) < (2 if command == "exec" else 1):
        raise UsageError(f'Error for command "{command}": requires at least {2 if command == "exec" else 1} '
                         f'arg(s), only received {len(operands)}')
    image, command_argv = operands[0], operands[1:]
    squashfs = _squashfs_image(image)
    if squashfs == "zstd":
        sys.stderr.write(f"FATAL:   could not open image {image}: corrupted image: unknown compression algorithm "
                         f"value 6\n")
        return 255
    container_env = _apptainer_env(profile, flags, os.environ, image=image if squashfs else None)
    if squashfs and not shutil.which("fuse2fs"):
        sys.stderr.write("INFO:    fuse2fs not found, will not be able to mount EXT3 filesystems\n")
    cwd = (flags.get("pwd") or [None])[-1]
    record_call(state, {"tool": prog, "profile": profile_name, "argv": [prog, *argv], "env": dict(os.environ),
                        "flags": flags, "image": image, "command": command_argv, "container_env": container_env,
                        "cwd": cwd, "subcommand": command})
    # run: the image's runscript with the arguments; a fake image has no ENTRYPOINT, and the
    # runscript Apptainer writes for such a docker image runs its arguments (`exec "$@"`)
    if not image.startswith(("docker://", "library://", "oras://", "shub://")) and not os.path.exists(image):
        sys.stderr.write(f"FATAL:   could not open image {image}: failed to retrieve path for {image}: "
                         f"lstat {image}: no such file or directory\n")
        return 255
    return _act(state, command_argv, container_env, cwd)


# Apptainer internal/pkg/util/env (create.go, env.go) and 99-runtimevars.sh: the exact rules
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ALWAYS_PASS = ("TERM", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY",
               "all_proxy", "ALL_PROXY", "ftp_proxy", "FTP_PROXY")
# name -> may a <PREFIX>ENV_ variable override it
ALWAYS_OMIT = {"HOME": False, "PATH": False, "APPTAINER_SHELL": False, "APPTAINER_APPNAME": False,
               "SINGULARITY_SHELL": False, "SINGULARITY_APPNAME": False, "LD_LIBRARY_PATH": True}
PATH_KEYS = {"PREPEND_PATH": "SING_USER_DEFINED_PREPEND_PATH", "APPEND_PATH": "SING_USER_DEFINED_APPEND_PATH",
             "PATH": "SING_USER_DEFINED_PATH"}


def _squashfs_image(image: str) -> str | None:
    """"gzip" or "zstd" (or another compressor's id) for a squashfs image file, else None."""
    try:
        with open(image, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:4] != b"hsqs":
        return None
    compressor = int.from_bytes(head[20:22], "little")
    return {1: "gzip", 6: "zstd"}.get(compressor, str(compressor))


def _image_scripts(image: str, env: dict[str, str], forwarded: dict[str, str]) -> dict[str, str]:
    """``env`` (create.go's) after the squashfs image's /.singularity.d/env scripts, as Apptainer
    1.1.9's action script runs them: each sourced in order (by sh here, for real) in an environment
    cleared but for HOME and PWD; the job's ``forwarded`` variables (APPTAINERENV_*, --env) put in
    right after 99-base.sh -- never when the image has env scripts but no 99-base.sh -- or, without
    /.singularity.d/env, after nothing; PATH completed from the default after 10-docker*.sh; then
    what the scripts left unset taken from ``env``, and what they left empty unset."""
    import shlex
    import tempfile

    listing = subprocess.run(["unsquashfs", "-d", "", "-lc", image, ".singularity.d/env"], capture_output=True,
                             text=True)
    names = sorted(line.rsplit("/", 1)[-1] for line in listing.stdout.splitlines()
                   if line.startswith("/.singularity.d/env/") and line.endswith(".sh"))
    inject = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in forwarded.items() if k.isidentifier())
    fixpath = ("for d in $(echo " + DEFAULT_PATH.replace(":", " ") + "); do case :$PATH: in *:$d:*) ;; "
               "*) PATH=$PATH:$d ;; esac; done; export PATH\n")
    with tempfile.TemporaryDirectory() as tmp:
        lines = ["unset PS1 PS2 PS4\n"]       # sh's own defaults, which Apptainer's shell has not
        for name in names:
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(subprocess.run(["unsquashfs", "-cat", image, f".singularity.d/env/{name}"],
                                       capture_output=True).stdout)
            lines.append(f". {shlex.quote(path)}\n")
            if name.startswith("10-docker"):
                lines.append(fixpath)
            if name == "99-base.sh":
                lines.append(inject)
        if not names:
            lines.append(inject)
        lines.append("exec env -0\n")
        out = subprocess.run(["sh", "-c", "".join(lines)], capture_output=True,
                             env={"HOME": env.get("HOME", ""), "PWD": os.getcwd()})
    after = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    for key, value in env.items():
        if key not in after:
            after[key] = value
    return {k: v for k, v in after.items() if v != "" or k not in env}


def _apptainer_env(profile: dict, flags: dict[str, list[str]], host: os._Environ | dict,
                   image: str | None = None) -> dict[str, str]:
    """The program's environment inside, by create.go's SetContainerEnv (see the module doc);
    ``image``: a squashfs image whose env scripts apply."""
    clean = "cleanenv" in flags or "containall" in flags
    prefixes = profile["prefixes"]
    control = ("APPTAINER_", "SINGULARITY_") if profile["prog"] == "apptainer" else ("SINGULARITY_",)
    env: dict[str, str] = {"LANG": "C"} if clean else {}
    overridden: dict[str, str] = {}
    for prefix in prefixes:                                # the first prefix wins
        for key, value in host.items():
            if not key.startswith(prefix) or len(key) == len(prefix):
                continue
            name = key[len(prefix):]
            if name in PATH_KEYS:
                name = PATH_KEYS[name]
            elif ALWAYS_OMIT.get(name) is False:
                sys.stderr.write(f"WARNING: Overriding {name} environment variable with {key} is not permitted\n")
                continue
            if name not in overridden:
                overridden[name] = value
    for key, value in host.items():
        if key.startswith(control) or key.startswith(prefixes) or key in overridden:
            continue
        if key in ALWAYS_PASS or (key not in ALWAYS_OMIT and not clean):
            env[key] = value
    env.update(overridden)
    if clean and profile.get("clean_lang_forced"):
        env["LANG"] = "C"
    for item in flags.get("env", []):
        for pair in item.split(","):                       # --env splits its value on commas
            key, eq, value = pair.partition("=")
            if eq:
                env[key] = value
    env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    env["PATH"] = DEFAULT_PATH
    if image:
        forwarded = {**overridden, **{k: v for k, v in env.items() if k in {p.partition("=")[0] for item in
                                                                              flags.get("env", [])
                                                                              for p in item.split(",")}}}
        env = _image_scripts(image, {k: v for k, v in env.items() if k not in forwarded}, forwarded)
    # /.singularity.d/env/99-runtimevars.sh, inside the container
    if env.get("SING_USER_DEFINED_PREPEND_PATH"):
        env["PATH"] = f"{env['SING_USER_DEFINED_PREPEND_PATH']}:{env['PATH']}"
    if env.get("SING_USER_DEFINED_APPEND_PATH"):
        env["PATH"] = f"{env['PATH']}:{env['SING_USER_DEFINED_APPEND_PATH']}"
    if env.get("SING_USER_DEFINED_PATH"):
        env["PATH"] = env["SING_USER_DEFINED_PATH"]
    for key in PATH_KEYS.values():
        env.pop(key, None)
    return env


def _apptainer_build(prog: str, args: list[str], state: str) -> int:
    flags, operands = _pflag("build", args, {"arch", "bind", "build-arg", "section", "library", "mount"},
                             {"force", "sandbox", "fakeroot", "notest", "nohttps", "no-https", "disable-cache",
                              "update", "fix-perms", "ignore-fakeroot-command"})
    if len(operands) != 2:
        raise UsageError(f'Error for command "build": requires exactly 2 arg(s), only received {len(operands)}')
    out, source = operands
    record_call(state, {"tool": prog, "argv": [prog, "build", *args], "env": dict(os.environ), "flags": flags,
                        "output": out, "source": source})
    if os.path.exists(out) and "force" not in flags:
        sys.stderr.write(f"FATAL:   While performing build: full path {out} already exists\n")
        return 255
    behaviour = _behaviour(state)
    time.sleep(float(behaviour.get("build_seconds", 0)))          # a conversion takes a while
    if behaviour.get("build_fails"):
        sys.stderr.write(f"FATAL:   While performing build: conveyor failed to get: {source}: manifest unknown\n")
        return 255
    Path(out).write_bytes(b"SIF_MAGIC" + source.encode())
    return 0


# ---- Enroot --------------------------------------------------------------------------------------
ENROOT_OPTIONS = {
    # command: {option: takes a value?} from each command's option loop in enroot.in (4.1.2)
    "import": {"-a": True, "--arch": True, "-o": True, "--output": True},
    "create": {"-f": False, "--force": False, "-n": True, "--name": True},
    "start": {"-c": True, "--conf": True, "-m": True, "--mount": True, "-e": True, "--env": True,
              "-r": False, "--root": False, "--rc": True, "-w": False, "--rw": False},
    "remove": {"-f": False, "--force": False},
    "export": {"-o": True, "--output": True, "-f": False, "--force": False},
    "list": {"-f": False, "--fancy": False},
    "digest": {"-a": True, "--arch": True},
}
# enroot digest's usage (stdout, exit 1) and its words, as enroot 4.1.2 printed them
# (tests/fixtures/conformance/enroot.json, the digest-* cases)
DIGEST_USAGE = ("Usage: enroot digest [options] [--] URI\n\nPrint the SHA256 digest of a container image.\n\n"
                " Schemes:\n   docker://[USER@][REGISTRY#]IMAGE[:TAG]  Get digest of a Docker image from a registry\n\n"
                " Options:\n   -a, --arch    Architecture of the image (defaults to host architecture)\n")
REGISTRY_GRANT = "[INFO] Querying registry for permission grant\n"
REGISTRY_GRANTED = "[INFO] Permission granted\n"


def _enroot_opts(command: str, argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    known = ENROOT_OPTIONS[command]
    long_of = {"-a": "--arch", "-o": "--output", "-f": "--force", "-n": "--name", "-c": "--conf",
               "-m": "--mount", "-e": "--env", "-r": "--root", "-w": "--rw"}
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return opts, argv[i:]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in known or (eq and not known[name]):
            raise UsageError(f"Usage: enroot {command} [options] [--] ...", status=1)
        if known[name] and not eq:
            if i + 1 >= len(argv) or not argv[i + 1]:
                raise UsageError(f"Usage: enroot {command} [options] [--] ...", status=1)
            i += 1
            value = argv[i]
        elif eq and not value:
            raise UsageError(f"Usage: enroot {command} [options] [--] ...", status=1)
        opts.setdefault(long_of.get(name, name), []).append(value if known[name] else "")
        i += 1
    return opts, []


def _enroot_err(message: str) -> int:
    sys.stderr.write(f"[ERROR] {message}\n")
    return 1


def enroot_main(argv: list[str], state: str) -> int:
    """enroot.in: its paths' defaults, ``mkdir -p`` of them as the caller, then the command."""
    env = os.environ
    home = env.get("HOME") or os.path.expanduser("~")
    xdg_runtime = env.get("XDG_RUNTIME_DIR") or "/run"
    paths = {
        "ENROOT_RUNTIME_PATH": env.get("ENROOT_RUNTIME_PATH") or f"{xdg_runtime}/enroot",
        "ENROOT_CACHE_PATH": env.get("ENROOT_CACHE_PATH") or f"{env.get('XDG_CACHE_HOME') or home + '/.cache'}/enroot",
        "ENROOT_DATA_PATH": env.get("ENROOT_DATA_PATH") or f"{env.get('XDG_DATA_HOME') or home + '/.local/share'}/enroot",
        "ENROOT_TEMP_PATH": env.get("ENROOT_TEMP_PATH") or env.get("TMPDIR") or "/tmp",
    }
    entry = {"tool": "enroot", "argv": ["enroot", *argv], "env": dict(env), "paths": paths}
    record_call(state, entry)
    if argv[:1] == ["version"]:                   # no --version: usage, exit 1 (recorded, 4.1.2)
        print("4.1.2")
        return 0
    if not argv or argv[0] not in ENROOT_OPTIONS:
        print("Usage: enroot COMMAND [ARG...]")    # on stdout, exit 1, as enroot 4.1.2 does (--version too)
        return 1
    old = os.umask(0o077)                        # (umask 077 && mkdir -p CACHE DATA RUNTIME)
    try:
        for key in ("ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_RUNTIME_PATH"):
            try:
                os.makedirs(paths[key], exist_ok=True)
            except PermissionError:
                # coreutils quotes with ‘’ in a UTF-8 locale (recorded: start-sqsh-xdg-missing-dir, LANG=C.UTF-8)
                # (an LC_CTYPE=C.UTF-8 alone is Python's own C-locale coercion, PEP 538: the caller's C)
                ctype = env.get("LC_CTYPE") if env.get("LANG") or env.get("LC_CTYPE") != "C.UTF-8" else None
                charset = (env.get("LC_ALL") or ctype or env.get("LANG") or "").lower()
                left, right = ("\u2018", "\u2019") if "utf-8" in charset or "utf8" in charset else ("'", "'")
                sys.stderr.write(f"mkdir: cannot create directory {left}{_first_missing(paths[key])}{right}: "
                                 f"Permission denied\n")
                return 1
    finally:
        os.umask(old)
    opts, operands = _enroot_opts(argv[0], argv[1:])
    commands = {"import": _enroot_import, "create": _enroot_create, "remove": _enroot_remove,
                "list": _enroot_list, "start": _enroot_start, "export": _enroot_export, "digest": _enroot_digest}
    return commands[argv[0]](opts, operands, paths["ENROOT_DATA_PATH"], state, entry)


def _enroot_import(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    if len(operands) != 1:
        raise UsageError("Usage: enroot import [options] [--] URI", status=1)
    uri = operands[0]
    if not re.fullmatch(r"docker://([^@#/]+@)?([^#/]+#)?[^#]+", uri):
        return _enroot_err(f"Invalid argument: {uri}")
    out = (opts.get("--output") or [None])[-1] or re.sub(r"[/:#@]", "+", uri.split("://", 1)[1]) + ".sqsh"
    if os.path.exists(out):
        return _enroot_err(f"File already exists: {out}")
    if _behaviour(state).get("import_fails"):
        return _enroot_err(f"Could not fetch the image manifest for {uri}")
    Path(out).write_bytes(SQUASHFS_MAGIC + json.dumps({"source": uri, "digest": registry_digest(uri, state)}).encode())
    return 0


def registry_digest(uri: str, state: str) -> str:
    """What the fake registry's manifest of ``uri`` digests to: the test's ``digests`` (a tag
    pushed again), else one fixed per URI."""
    import hashlib

    return _behaviour(state).get("digests", {}).get(uri) or "sha256:" + hashlib.sha256(uri.encode()).hexdigest()


def _enroot_digest(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    """runtime::digest (docker::digest, src/docker.sh), as recorded from enroot 4.1.2: the registry
    queried ("[INFO]" lines on stderr), the manifest's digest on stdout; a tag the registry lacks,
    exit 1 with the URL and "404 Not Found"; anything but docker:// "Invalid argument"."""
    if len(operands) != 1:
        sys.stdout.write(DIGEST_USAGE)               # recorded: the usage on stdout, exit 1
        return 1
    uri = operands[0]
    match = re.fullmatch(r"docker://(?:[^@#/]+@)?(?:([^#/]+)#)?([^#:@]+)(?::([^#@]+))?(@sha256:[0-9a-f]{64})?", uri)
    if not match:
        return _enroot_err(f"Invalid argument: {uri}")
    sys.stderr.write(REGISTRY_GRANT)
    if _behaviour(state).get("import_fails"):
        registry, image, tag = match.group(1) or "registry-1.docker.io", match.group(2), match.group(3) or "latest"
        image = image if "/" in image or match.group(1) else f"library/{image}"
        scheme = "http" if os.environ.get("ENROOT_ALLOW_HTTP") else "https"     # src/docker.sh's curl_proto
        return _enroot_err(f"URL {scheme}://{registry}/v2/{image}/manifests/{tag} returned error code: 404 Not Found")
    sys.stderr.write(REGISTRY_GRANTED)
    print(registry_digest(uri, state))
    return 0


def _enroot_create(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    if len(operands) != 1:
        raise UsageError("Usage: enroot create [options] [--] IMAGE", status=1)
    image = operands[0]
    if not os.path.isfile(image):
        return _enroot_err(f"No such file or directory: {os.path.realpath(image)}")
    with open(image, "rb") as fh:
        if fh.read(4) != SQUASHFS_MAGIC:
            return _enroot_err(f"Invalid image format: {os.path.realpath(image)}")
    name = (opts.get("--name") or [None])[-1] or os.path.basename(image).removesuffix(".sqsh")
    if "/" in name:
        return _enroot_err(f"Invalid argument: {name}")
    rootfs = os.path.join(data, name)
    if os.path.exists(rootfs) and "--force" not in opts:
        return _enroot_err(f"File already exists: {os.path.realpath(rootfs)}")
    os.makedirs(os.path.join(rootfs, "etc"), exist_ok=True)
    Path(rootfs, "etc", "environment").write_text("PATH=/usr/local/bin:/usr/bin:/bin\n")
    return 0


def _enroot_export(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    """runtime::export (src/runtime.sh; options -o/--output, -f/--force in enroot.in): a
    container's root as a squashfs file (``NAME.sqsh`` in the working directory unless --output);
    a name with '/' is "Invalid argument", a missing container "No such file or directory", an
    existing file needs --force ("File already exists: ...")."""
    if len(operands) != 1:
        raise UsageError("Usage: enroot export [options] [--] NAME", status=1)
    name = operands[0]
    rootfs = os.path.join(data, name)
    if "/" in name:
        return _enroot_err(f"Invalid argument: {name}")
    if not os.path.isdir(rootfs):
        return _enroot_err(f"No such file or directory: {os.path.realpath(rootfs)}")
    out = (opts.get("--output") or [None])[-1] or f"{name}.sqsh"
    if os.path.exists(out) and "--force" not in opts:
        return _enroot_err(f"File already exists: {os.path.realpath(out)}")
    files = sorted(str(p.relative_to(rootfs)) for p in Path(rootfs).rglob("*"))
    Path(out).write_bytes(SQUASHFS_MAGIC + json.dumps({"exported": name, "files": files}).encode())
    return 0


def _enroot_remove(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    for name in operands:
        rootfs = os.path.join(data, name)
        if "/" in name:
            return _enroot_err(f"Invalid argument: {name}")
        if not os.path.isdir(rootfs):
            return _enroot_err(f"No such file or directory: {os.path.realpath(rootfs)}")
        if "--force" not in opts:
            sys.stderr.write(f"Do you really want to delete {rootfs}? [y/N] ")
            if not sys.stdin.readline().strip().lower().startswith("y"):
                continue
        shutil.rmtree(rootfs)
    return 0


def _enroot_list(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    for name in sorted(os.listdir(data)):
        print(name)
    return 0


NSENTER = "enroot-nsenter"


def _enroot_start(opts: dict, operands: list[str], data: str, state: str, entry: dict) -> int:
    if not operands:
        raise UsageError("Usage: enroot start [options] [--] NAME|IMAGE [COMMAND] [ARG...]", status=1)
    name, command_argv = operands[0], operands[1:]
    image = _is_squashfs(name)          # runtime::start: a squashfs file is started as it is
    if "/" in name and not image:
        return _enroot_err(f"Invalid argument: {name}")
    rootfs = os.path.realpath(name) if image else os.path.join(data, name)
    if not image and not os.path.isdir(rootfs):
        return _enroot_err(f"No such file or directory: {os.path.realpath(rootfs)}")
    for mount in opts.get("--mount", []):
        if not re.fullmatch(r"[^\s]+(:[^\s]+)*", mount):
            return _enroot_err(f"Invalid argument: {mount}")
    env = os.environ
    for item in opts.get("--env", []):
        if not re.match(r"[A-Za-z_][A-Za-z0-9_]*(=|$)", item):
            return _enroot_err(f"Invalid argument: {item}")
    rc = (opts.get("--rc") or [None])[-1] or None      # runtime::start: an empty one is none (`[ -n "${rc}" ]`)
    if rc is not None and not stat_is_fifo(rc):    # runtime::start: a FIFO as is, else realpath, a file
        rc = os.path.realpath(rc)
        if not os.path.isfile(rc):
            return _enroot_err(f"No such file or directory: {rc}")
    conf = (opts.get("--conf") or [None])[-1]
    if conf is not None:
        conf = os.path.realpath(conf)
        if not os.path.isfile(conf):
            return _enroot_err(f"No such file or directory: {conf}")
        if subprocess.run(["bash", "-n", conf], capture_output=True).returncode != 0:
            return _enroot_err(f"Invalid argument: {conf}")
    # runtime::start then execs its helper by name (`exec enroot-nsenter ...`): an enroot whose
    # directory is not on its PATH fails here, as enroot 4.1.2 installed under /opt did by hand
    # (2026-12-02, `enroot start` as a user with PATH=/usr/bin:/bin: exit 127, these words)
    if not shutil.which(NSENTER, path=os.environ.get("PATH", os.defpath)):
        sys.stderr.write(f"/usr/lib/enroot/runtime.sh: line 354: exec: {NSENTER}: not found\n")
        return 127
    # runtime::_do_environ: the image's /etc/environment (envsubst'ed), the config's environ(), the
    # --env arguments (awk: NAME alone takes ENVIRON[NAME], empty when unset) -- one file
    lines = []
    if image:
        # runtime::_mount_rootfs: squashfuse (the image, lower) under an overlay (a tmpfs upper),
        # run by a "fuse-shim" in a process group of its own that stops itself and ends them on the
        # SIGHUP its orphaned group gets once enroot's process has gone
        # (fuse-overlayfs only with ENROOT_NATIVE_OVERLAYFS off: 4.1.2's default is the kernel's overlay)
        native = os.environ.get("ENROOT_NATIVE_OVERLAYFS", "y").lower() not in ("", "n", "no", "false", "0")
        for tool in ("squashfuse", "mountpoint", *(() if native else ("fuse-overlayfs",))):
            if not shutil.which(tool):
                return _enroot_err(f"Command not found: {tool}")
        try:
            os.close(os.open("/dev/fuse", os.O_RDWR))
        except OSError as exc:         # recorded: tests/fixtures/conformance/enroot.json, start-sqsh-*
            sys.stderr.write(f"[WARN] fuse: failed to open /dev/fuse: {os.strerror(exc.errno)}\n")
            return _enroot_err(f"Failed to mount: {rootfs}")
        _fuse_shim()
    etc_environment = Path(rootfs if not image and "/" not in name else "/nonexistent", "etc", "environment")
    if etc_environment.is_file():
        lines += [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), line)
                  for line in etc_environment.read_text().splitlines()]
    elif image:
        try:
            found = subprocess.run(["unsquashfs", "-cat", rootfs, "etc/environment"], capture_output=True)
        except OSError:
            found = None
        if found is not None and found.returncode == 0:
            lines += found.stdout.decode("utf-8", "surrogateescape").splitlines()
    if conf is not None:
        # as enroot.in runs it: bash with `set -euo pipefail` and lastpipe (a config that uses an
        # unset variable or a failing command fails the start)
        script = ('set -euo pipefail; shopt -s lastpipe; source "$1"; '
                  'if declare -F environ > /dev/null; then environ; fi')
        run = subprocess.run(["bash", "--norc", "-c", script, "bash", conf], capture_output=True,
                             env={**env, "ENROOT_ROOTFS": rootfs, "ENROOT_ENVIRON": "/dev/null"})
        if run.returncode != 0:
            sys.stderr.buffer.write(run.stderr)
            return run.returncode
        lines += run.stdout.decode("utf-8", "surrogateescape").split("\n")
    # runtime::_do_rc: --rc's file, else the config's rc() (its body, as `declare -f rc | sed
    # '1,2d;$d'` prints it), else none (the image's /etc/rc)
    rc_text = Path(rc).read_text() if rc else None
    if rc is None and conf is not None:
        script = ('set -euo pipefail; shopt -s lastpipe; source "$1"; '
                  "if declare -F rc > /dev/null; then declare -f rc | sed '1,2d;$d'; else exit 3; fi")
        run = subprocess.run(["bash", "--norc", "-c", script, "bash", conf], capture_output=True, env=dict(env))
        if run.returncode not in (0, 3):
            sys.stderr.buffer.write(run.stderr)
            return run.returncode
        rc_text = run.stdout.decode("utf-8", "surrogateescape") if run.returncode == 0 else None
    # runtime::_do_mounts_fini: the config's mounts(), then each --mount with ':' made ' ' -- one
    # fstab file for enroot-mount (getmntent: fields split on blanks, \040 and the like decoded)
    fstab = []
    if conf is not None:
        script = ('set -euo pipefail; shopt -s lastpipe; source "$1"; '
                  'if declare -F mounts > /dev/null; then mounts; fi')
        run = subprocess.run(["bash", "--norc", "-c", script, "bash", conf], capture_output=True,
                             env={**env, "ENROOT_ROOTFS": rootfs})
        if run.returncode != 0:
            sys.stderr.buffer.write(run.stderr)
            return run.returncode
        fstab += [line for line in run.stdout.decode("utf-8", "surrogateescape").split("\n") if line.strip()]
    fstab += [mount.replace(":", " ") for mount in opts.get("--mount", [])]
    entries = [[re.sub(r"\\(0[0-7]{2}|1[0-7]{2})", lambda m: chr(int(m.group(1), 8)), f) for f in line.split()]
               for line in fstab if not line.lstrip().startswith("#")]
    for item in opts.get("--env", []):
        lines.append(item if "=" in item else f"{item}={env.get(item, '')}")
    lines = _envfmt(_envfmt(lines))         # before and after the hooks
    container_env = {}                      # enroot-switchroot: clearenv(), then the file, last wins
    for line in lines:
        key, eq, value = line.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            container_env[key] = value
    user = pwd.getpwuid(os.getuid())        # then its login defaults where still unset
    for key, value in (("TERM", "dumb"), ("HOME", user.pw_dir), ("SHELL", user.pw_shell), ("USER", user.pw_name),
                       ("LOGNAME", user.pw_name), ("PATH", "/usr/local/bin:/bin:/usr/bin")):
        container_env.setdefault(key, value)
    record_call(state, {**entry, "tool": "enroot-container", "container": name, "command": command_argv,
                        "container_env": container_env, "writable": "--rw" in opts,
                        "mounts": opts.get("--mount", []),
                        "fstab": entries,
                        "rc": rc_text,
                        "remap_root": "--root" in opts or os.environ.get("ENROOT_REMAP_ROOT", "") in ("y", "yes", "1")})
    return _act(state, command_argv or ["/bin/sh"], container_env, None)


def _is_squashfs(path: str) -> bool:
    """runtime::start's test: a regular file (after symlinks) ``unsquashfs -s`` reads -- its magic
    here -- with an unsquashfs installed (``command -v unsquashfs``: without one, no file is an
    image and a path is "Invalid argument")."""
    if not shutil.which("unsquashfs"):
        return False
    try:
        with open(path, "rb") as fh:
            return os.path.isfile(path) and fh.read(4) == SQUASHFS_MAGIC
    except OSError:
        return False


def _fuse_shim() -> None:
    """enroot's fuse shim for an image started as a file: a child in a process group of its own
    that stops itself and exits on SIGHUP (killing its group, the fuse daemons). Its parent
    here is this process, which runs the command and exits: the group is then orphaned -- unless
    a child subreaper of the same session inherits it, which the kernel never signals."""
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open("/dev/null", os.O_RDWR)     # enroot's holds no stdio of the caller's
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 65536)
            os.setpgid(0, 0)
            signal.signal(signal.SIGHUP, lambda *_: os._exit(0))
            os.kill(os.getpid(), signal.SIGSTOP)
            while True:
                signal.pause()
        finally:
            os._exit(1)
    for _ in range(1000):        # "wait for the fuse mounts": the shim has stopped itself
        try:
            if os.waitpid(pid, os.WUNTRACED | os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return
        time.sleep(0.001)


def stat_is_fifo(path: str) -> bool:
    import stat

    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _envfmt(lines: list[str]) -> list[str]:
    """common::envfmt (src/common.sh): leading blanks go; comments, empty and ill-formed lines and
    ENROOT_* go; a pair of quotes around a whole value goes."""
    out = []
    for line in lines:
        line = re.sub(r"^[ \t\n\v\f\r]+", "", line)
        if not line or line.startswith("#") or not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line) \
                or line.startswith("ENROOT_"):
            continue
        out.append(re.sub(r"^([A-Za-z_][A-Za-z0-9_]*)=[\"'](.*)[\"'][ \t\v\f\r]*$", r"\1=\2", line))
    return out


def _first_missing(path: str) -> str:
    """The first directory of ``path`` that does not exist (what ``mkdir -p`` names in its error)."""
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        candidate = os.path.join(*parts[:i])
        if not os.path.exists(candidate):
            return candidate
    return path


# ---- shared ----------------------------------------------------------------------------------
def _behaviour(state: str) -> dict:
    try:
        with open(os.path.join(state, "behaviour.json")) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {}


def _act(state: str, command: list[str], env: dict[str, str], cwd: str | None) -> int:
    """What the containerized program does: the test's exit code, or run it on the host."""
    behaviour = _behaviour(state)
    if behaviour.get("run"):
        try:
            return subprocess.run(command, env=env, cwd=cwd if cwd and os.path.isdir(cwd) else None).returncode
        except FileNotFoundError:
            sys.stderr.write(f"FATAL:   \"{command[0]}\": executable file not found in $PATH\n")
            return 255
    return int(behaviour.get("exit_code", 0))


def main(name: str, argv: list[str], state: str) -> int:
    profile = _behaviour(state).get("profiles", {}).get(name) or {"apptainer": "apptainer-1",
                                                                   "singularity": "singularity-4"}.get(name)
    if name == "enroot":
        return run_main("enroot", lambda: enroot_main(argv, state))
    return run_main(name, lambda: apptainer_main(profile, argv, state))


class FakeRuntimes(FakeCommands):
    """``apptainer``, ``singularity`` and ``enroot`` in ``bin_dir``; their calls and behaviour."""

    NAMES = ("apptainer", "singularity", "enroot")

    def __init__(self, root: Path, *, singularity: str = "singularity-4", apptainer: str = "apptainer-1",
                 python: str | None = None):
        self.root = Path(root)
        self.bin_dir, self.state_dir = self.root / "bin", self.root / "state"
        install_fakes(self.bin_dir, "runtimes", self.NAMES, self.state_dir, python)
        helper = self.bin_dir / NSENTER           # enroot's helper beside it, as `make install` puts it
        helper.write_text("#!/bin/sh\necho 'the fake enroot never runs its helper' >&2\nexit 1\n")
        helper.chmod(0o755)
        os.chmod(self.state_dir, 0o777)                  # ranks may run as another user
        self.configure(profiles={"singularity": singularity, "apptainer": apptainer})

    def configure(self, **behaviour) -> None:
        """Change what the fakes do: ``exit_code``, ``run``, ``profiles`` (name -> profile),
        ``build_seconds``, ``build_fails``, ``import_fails``."""
        current = _behaviour(str(self.state_dir))
        current.update(behaviour)
        path = self.state_dir / "behaviour.json"
        path.write_text(json.dumps(current))
        path.chmod(0o644)

    def calls(self, tool: str | None = None) -> list[dict]:
        """The recorded calls (of ``tool`` only: apptainer, singularity, enroot, enroot-container)."""
        return [c for c in super().calls() if tool is None or c["tool"] == tool]

    def path_env(self, base: str = "/usr/bin:/bin") -> str:
        return f"{self.bin_dir}:{base}"

"""``tether pbs install``: tether's PBS hooks, the files they need on each host, and the qmgr commands.

Without ``apply`` it prints what it would do and changes nothing. With ``apply``, on every PBS host
(server and execution hosts alike): it builds ``tether-jobdirs`` (the MoM hooks' directory helper:
tether.native's jobdirs.c and pbs_hooks/tether_jobdirs.c) and writes tether's container launcher
into ``libexec``, creates job_storage_root, writes the hooks' JSON configs into ``hook_dir`` and runs
the qmgr commands (on an execution host without qmgr rights they fail: print them and run them on
the server host). The hook files (pbs_hooks/tether_submit.py, tether_exec.py) are imported as they
are; their JSON configs carry tether's Python path and what each hook needs -- the submit hook the
validated configuration itself, so no hook parses YAML inside PBS (see tether.pbs_hooks).
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path

from ..hooks.config import Config, plain_data
from ..hooks.surface import PBS_RESOURCES
from ..native.build import source_dir as native_source_dir
from ..system.files import write_atomic
from ..system.proc import CommandError, run_command
from ..system.toolchain import CBuild, tether_import_path
from .host import LAUNCHER_NAME, ensure_storage_root, install_launcher

SUBMIT_HOOK, EXEC_HOOK = "tether_submit", "tether_exec"
HOOK_EVENTS = {SUBMIT_HOOK: "queuejob,modifyjob",
               EXEC_HOOK: "execjob_begin,execjob_launch,execjob_end,execjob_abort"}
HELPER_NAME = "tether-jobdirs"
DEFAULT_HOOK_DIR = "/etc/tether"
DEFAULT_LIBEXEC = "/opt/tether/libexec"
NOTES = """\
# Then, for GPU slots (on the server host): ngpus must exist before a node can have it, and be a host
#   resource the scheduler schedules on -- create it, give GPU vnodes their count, add ngpus to the
#   "resources:" line of PBS_HOME/sched_priv/sched_config (e.g. resources: "ncpus, mem, arch, host,
#   vnode, aoe, eoe, ngpus") and signal the scheduler (kill -HUP <pbs_sched pid>):
#   qmgr -c 'create resource ngpus type=long,flag=hn'
#   qmgr -c 'set node <vnode> resources_available.ngpus = 4'
"""


def pbs_source_dir() -> Path:
    return Path(str(resources.files("tether.pbs_hooks")))


def hook_file(name: str = SUBMIT_HOOK) -> Path:
    """A hook file shipped in the package."""
    return pbs_source_dir() / f"{name}.py"


def build_helper(libexec: Path, *, build_dir: Path | None = None) -> Path:
    """Compile tether-jobdirs into ``libexec`` (mode 755, a new inode); objects in ``build_dir``."""
    cbuild = CBuild(build_dir or Path(libexec) / ".build")
    shared = native_source_dir()
    objects = [cbuild.compile(shared / "jobdirs.c"), cbuild.compile(shared / "values.c"),
               cbuild.compile(pbs_source_dir() / "tether_jobdirs.c", include_dirs=[str(shared)], header_dirs=[shared])]
    return cbuild.link(objects, Path(libexec) / HELPER_NAME)


def hook_configs(config: Config, libexec: Path) -> dict[str, dict]:
    """Each hook's JSON config. The submit hook gets the validated configuration (PBS's hook
    interpreter cannot load a YAML parser); the MoM hooks the few settings they use."""
    paths = [tether_import_path()]
    return {SUBMIT_HOOK: {"python_path": paths, "config_source": config.source,
                          "config": plain_data(config.data)},
            EXEC_HOOK: {"python_path": paths, "job_storage_root": config.job_storage_root,
                        "user_dirs": ":".join(config.user_dir_bases()),
                        "helper": str(Path(libexec) / HELPER_NAME),
                        "launcher": str(Path(libexec) / LAUNCHER_NAME)}}


def qmgr_commands(hook_dir: Path) -> list[str]:
    """The qmgr commands, in order."""
    # flag=m: the resources reach the MoM hook too (OpenPBS: only with flag=m)
    cmds = [f"create resource {opt.pbs_resource} type={opt.pbs_type},flag=m" for opt in PBS_RESOURCES]
    for name, events in HOOK_EVENTS.items():
        cmds += [
            f"create hook {name}",
            f"set hook {name} event = \"{events}\"",
            f"set hook {name} order = 1",
            f"set hook {name} alarm = 30",
            f"import hook {name} application/x-python default {hook_file(name)}",
            f"import hook {name} application/x-config default {Path(hook_dir) / (name + '.json')}",
            f"set hook {name} enabled = true",
        ]
    return cmds


# What OpenPBS 23.06 answers a `create` of an existing object (tests/fixtures/pbs/openpbs-qmgr-cases.json):
# a resource, exit 207 "Duplicate entry in list"; a hook, exit 32 "hook name 'X' already registered".
ALREADY_THERE = ((207, "Duplicate entry in list"), (32, "already registered"))


def already_there(exc: CommandError) -> bool:
    """A refused ``qmgr -c 'create ...'`` whose object exists already: an install run again."""
    return any(exc.returncode == code and text in exc.stderr for code, text in ALREADY_THERE)


def install(config: Config, *, hook_dir: Path = Path(DEFAULT_HOOK_DIR), libexec: Path = Path(DEFAULT_LIBEXEC),
            apply: bool = False, log=print) -> list[str]:
    """Print (or, with ``apply``, do) this host's part and the qmgr commands; returns the commands."""
    libexec, hook_dir = Path(libexec), Path(hook_dir)
    configs = [hook_dir / f"{name}.json" for name in HOOK_EVENTS]
    cmds = qmgr_commands(hook_dir)
    if not apply:
        log(f"# would build {libexec / HELPER_NAME}, write {libexec / LAUNCHER_NAME}, create "
            f"{config.job_storage_root} and write {', '.join(map(str, configs))} (from {config.source})")
        log("# nothing was changed: run `tether pbs install --apply` on every PBS host; it runs these "
            "(the qmgr commands on the server host):")
        for cmd in cmds:
            log(f"qmgr -c {shlex.quote(cmd)}")
        log(NOTES.rstrip())
        return cmds
    libexec.mkdir(parents=True, exist_ok=True)
    log(f"# built {build_helper(libexec)}; wrote {install_launcher(libexec, config, log=log)}")
    ensure_storage_root(Path(config.job_storage_root), log=lambda m: log("# " + m))
    for name, settings in hook_configs(config, libexec).items():
        write_atomic(hook_dir / f"{name}.json", json.dumps(settings, indent=2) + "\n", 0o644)
    log(f"# wrote {', '.join(map(str, configs))}")
    for cmd in cmds:
        try:
            run_command(["qmgr", "-c", cmd], timeout=60)
        except CommandError as exc:
            if not (cmd.startswith("create ") and already_there(exc)):
                raise
            log(f"qmgr -c {shlex.quote(cmd)}: already there, kept (the commands after it update it)")
            if cmd.split()[:3] in (["create", "resource", opt.pbs_resource] for opt in PBS_RESOURCES
                                   if opt.kind == "count"):
                log(f"#   an existing resource keeps its type: one made type=long by an older tether drops a "
                    f"malformed -l value unseen; `qmgr -c 'delete resource {cmd.split()[2]}'` (refused while a "
                    f"job, also a finished one in history, uses it) and run this again")
            continue
        log(f"qmgr -c {shlex.quote(cmd)}")
    log(NOTES.rstrip())
    return cmds

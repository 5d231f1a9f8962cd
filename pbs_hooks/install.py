"""``tether pbs install``: tether's PBS hooks, the files they need on each host, and the qmgr commands.

On every PBS host (server and execution hosts alike) it builds ``tether-jobdirs`` (the MoM hooks'
directory helper, from the SPANK plugin's C source) and writes tether's container launcher into
``libexec`` (default /opt/tether/libexec), creates job_storage_root, and writes the hooks' JSON
configs into ``hook_dir`` (default /etc/tether). Then it prints the qmgr commands (an admin can
paste them on the server host), or with ``apply`` runs them through ``qmgr -c``. The hook files
(pbs_hooks/tether_submit.py, tether_exec.py) are imported as they are; their JSON configs name
tether's Python path and what each hook needs, so the hooks read neither YAML nor the planner at a
job's start.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path

from tether.hooks.config import Config
from tether.hooks.native import compile_c, tether_import_path, write_atomic
from tether.hooks.proc import CommandError, run_command

from . import RESOURCES

SUBMIT_HOOK, EXEC_HOOK = "tether_submit", "tether_exec"
HOOK_EVENTS = {SUBMIT_HOOK: "queuejob,modifyjob",
               EXEC_HOOK: "execjob_begin,execjob_launch,execjob_end,execjob_abort"}
HELPER_NAME = "tether-jobdirs"
DEFAULT_HOOK_DIR = "/etc/tether"
DEFAULT_LIBEXEC = "/opt/tether/libexec"
NOTES = """\
# Then, for GPU slots: ngpus must be a host resource the scheduler schedules on: add it to the
#   "resources:" line of PBS_HOME/sched_priv/sched_config (e.g. resources: "ncpus, mem, arch, host,
#   vnode, aoe, eoe, ngpus") and signal the scheduler (kill -HUP <pbs_sched pid>); give GPU vnodes
#   resources_available.ngpus (qmgr -c "set node <vnode> resources_available.ngpus = 4").
"""


def hook_file(name: str = SUBMIT_HOOK) -> Path:
    """A hook file shipped in the package."""
    return Path(str(resources.files("tether.pbs_hooks").joinpath(f"{name}.py")))


def helper_source() -> str:
    """tether-jobdirs: the SPANK plugin's directory code and the helper's main()."""
    return (resources.files("tether.spank").joinpath("jobdirs.c").read_text() + "\n"
            + resources.files("tether.pbs_hooks").joinpath("jobdirs_main.c").read_text())


def build_helper(libexec: Path) -> Path:
    """Compile tether-jobdirs into ``libexec`` (mode 755, a new inode)."""
    return compile_c(source=helper_source(), target=Path(libexec) / HELPER_NAME)


def hook_configs(config: Config, config_path: str | None, libexec: Path) -> dict[str, dict]:
    """Each hook's JSON config. The submit hook reads tether's config (None: the default search,
    $TETHER_CONFIG then /etc/tether/tether.yaml); the MoM hooks get the few settings they use."""
    from tether.job_submit.install import LAUNCHER_NAME

    paths = [tether_import_path()]
    return {SUBMIT_HOOK: {"python_path": paths, "config": config_path},
            EXEC_HOOK: {"python_path": paths, "job_storage_root": config.job_storage_root,
                        "helper": str(Path(libexec) / HELPER_NAME),
                        "launcher": str(Path(libexec) / LAUNCHER_NAME)}}


def qmgr_commands(hook_dir: Path) -> list[str]:
    """The qmgr commands, in order."""
    # flag=m: the resources reach the MoM hook too (OpenPBS: only with flag=m)
    cmds = [f"create resource {name} type={kind},flag=m" for name, (_, kind) in RESOURCES.items()]
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


def install(config: Config, config_path: str | None, *, hook_dir: Path = Path(DEFAULT_HOOK_DIR),
            libexec: Path = Path(DEFAULT_LIBEXEC), apply: bool = False, log=print) -> list[str]:
    """Install this host's part and print (or run) the qmgr commands; returns the commands."""
    from tether.job_submit.install import ensure_storage_root, install_launcher

    libexec = Path(libexec)
    libexec.mkdir(parents=True, exist_ok=True)
    log(f"# built {build_helper(libexec)}; wrote {install_launcher(libexec, config)}")
    ensure_storage_root(Path(config.job_storage_root), log=lambda m: log("# " + m))
    for name, settings in hook_configs(config, config_path, libexec).items():
        write_atomic(Path(hook_dir) / f"{name}.json", json.dumps(settings, indent=2) + "\n", 0o644)
    log(f"# wrote {', '.join(str(Path(hook_dir) / (n + '.json')) for n in HOOK_EVENTS)}")
    cmds = qmgr_commands(hook_dir)
    if not apply:
        log("# run `tether pbs install` on every execution host too; then, as root on the PBS server host:")
        for cmd in cmds:
            log(f"qmgr -c {shlex.quote(cmd)}")
        log(NOTES.rstrip())
        return cmds
    for cmd in cmds:
        try:
            run_command(["qmgr", "-c", cmd], timeout=60)
        except CommandError as exc:
            exists = "already exists" in exc.stderr or "Duplicate entry" in exc.stderr
            if not (exists and cmd.startswith("create ")):
                raise
            log(f"qmgr -c {shlex.quote(cmd)}: already there, kept")
            continue
        log(f"qmgr -c {shlex.quote(cmd)}")
    log(NOTES.rstrip())
    return cmds

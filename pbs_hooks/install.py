"""``tether pbs install``: the qmgr commands that install tether's PBS server hook.

Prints them (an admin can paste them), or with ``apply`` runs them through ``qmgr -c``. The hook
file (pbs_hooks/tether_submit.py) is imported as is; its JSON config names tether's Python path and
tether's config file, so the hook finds both inside pbs_python.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path

from tether.hooks.native import tether_import_path, write_atomic
from tether.hooks.proc import CommandError, run_command

HOOK_NAME = "tether_submit"
# type=long for counts; flag=m so the resources reach MoM hooks too (OpenPBS: only with flag=m)
CUSTOM_RESOURCES = (("tether_slots", "long"), ("tether_slots_per_node", "long"),
                    ("tether_slot_type", "string"), ("tether_gpu_type", "string"))
NOTES = """\
# Then, for GPU slots: ngpus must be a host resource the scheduler schedules on: add it to the
#   "resources:" line of PBS_HOME/sched_priv/sched_config (e.g. resources: "ncpus, mem, arch, host,
#   vnode, aoe, eoe, ngpus") and signal the scheduler (kill -HUP <pbs_sched pid>); give GPU vnodes
#   resources_available.ngpus (qmgr -c "set node <vnode> resources_available.ngpus = 4").
"""


def hook_file() -> Path:
    """The hook file shipped in the package."""
    return Path(str(resources.files("tether.pbs_hooks").joinpath(f"{HOOK_NAME}.py")))


def hook_config(config_path: str | None) -> dict:
    """None: the hook uses tether's default search ($TETHER_CONFIG, /etc/tether/tether.yaml)."""
    return {"python_path": [tether_import_path()], "config": config_path}


def qmgr_commands(hook_path: Path, config_json: Path) -> list[str]:
    """The qmgr commands, in order."""
    cmds = [f"create resource {name} type={kind},flag=m" for name, kind in CUSTOM_RESOURCES]
    cmds += [
        f"create hook {HOOK_NAME}",
        f"set hook {HOOK_NAME} event = \"queuejob,modifyjob\"",
        f"set hook {HOOK_NAME} order = 1",
        f"set hook {HOOK_NAME} alarm = 30",
        f"import hook {HOOK_NAME} application/x-python default {hook_path}",
        f"import hook {HOOK_NAME} application/x-config default {config_json}",
        f"set hook {HOOK_NAME} enabled = true",
    ]
    return cmds


def install(config_path: str | None, config_json: Path, *, apply: bool = False, log=print) -> list[str]:
    """Write the hook's JSON config and print (or run) the qmgr commands; returns the commands."""
    write_atomic(config_json, json.dumps(hook_config(config_path), indent=2) + "\n", 0o644)
    cmds = qmgr_commands(hook_file(), config_json)
    if not apply:
        log(f"# wrote {config_json}; run as root on the PBS server host:")
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

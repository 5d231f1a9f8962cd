"""``tether launcher install``: the sudo policy, the job root and the state directory.

Printed by default; ``--apply`` (as root) writes them. The policy lets the service account run
exactly the agent, with no arguments, as the members of one group -- nothing else, as nobody else:

    Defaults!/usr/local/bin/tether-agent !requiretty, env_reset
    tether-launcher ALL = (%tether-users) NOPASSWD: /usr/local/bin/tether-agent ""

(sudoers: ``""`` as the arguments means "none allowed").
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import sys
from pathlib import Path

from ..hooks.config import Config
from ..system.files import write_atomic
from ..system.proc import CommandError, run_command

SUDOERS_FILE = "/etc/sudoers.d/tether-launcher"

AGENT_TEMPLATE = """\
#!{python} -I
# tether's launcher agent, written by `tether launcher install --apply`; run by the service through sudo.
import sys
sys.path[:0] = {paths!r}
from tether.launcher.agent import main
sys.exit(main())
"""


def sudoers_text(config: Config) -> str:
    settings = config.data["launcher"]
    agent = settings["agent"]
    return (f"# tether's launcher: {settings['service_user']} may run the agent -- and nothing else, without\n"
            f"# arguments -- as the members of {settings['users_group']} (written by `tether launcher install`)\n"
            f"Defaults!{agent} !requiretty, env_reset\n"
            f"{settings['service_user']} ALL = (%{settings['users_group']}) NOPASSWD: {agent} \"\"\n")


def agent_text() -> str:
    from ..system.toolchain import tether_import_path

    return AGENT_TEMPLATE.format(python=sys.executable, paths=[tether_import_path()])


def job_root(config: Config) -> str:
    return config.data["launcher"]["job_root"] or os.path.join(config.job_storage_root, "launcher")


def plan(config: Config) -> list[str]:
    """What --apply does, one line each."""
    settings = config.data["launcher"]
    return [f"write {settings['agent']} (root's, 0755): the agent, for this Python",
            f"write {SUDOERS_FILE} (0440, checked with visudo -c):\n" + sudoers_text(config).rstrip(),
            f"make {job_root(config)} (root's, mode 1777): each job's tree, made by its user",
            f"make {settings['state_root']} ({settings['service_user']}'s, 0700): the service's records"]


def apply(config: Config, *, sudoers: str = SUDOERS_FILE) -> list[str]:
    """Do it (as root); what was done."""
    if os.geteuid() != 0:
        raise PermissionError("tether launcher install --apply must run as root")
    settings = config.data["launcher"]
    try:
        service = pwd.getpwnam(settings["service_user"])
        grp.getgrnam(settings["users_group"])
    except KeyError as exc:
        raise LookupError(f"create it first: no such user or group {exc.args[0]!r} (launcher.service_user / "
                          f"launcher.users_group)") from None
    done = []
    write_atomic(settings["agent"], agent_text(), 0o755)
    done.append(f"wrote {settings['agent']}")
    text = sudoers_text(config)
    tmp = Path(sudoers).with_name(f".{Path(sudoers).name}.new")
    write_atomic(tmp, text, 0o440)
    if shutil.which("visudo"):
        try:
            run_command(["visudo", "-c", "-q", "-f", str(tmp)], timeout=30)
        except CommandError as exc:
            tmp.unlink(missing_ok=True)
            raise ValueError(f"visudo refused the policy: {exc}") from None
    os.replace(tmp, sudoers)
    done.append(f"wrote {sudoers}")
    root = Path(job_root(config))
    root.mkdir(parents=True, exist_ok=True)
    if root.is_symlink() or not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    os.chown(root, 0, 0)
    os.chmod(root, 0o1777)
    done.append(f"made {root} (1777)")
    state = Path(settings["state_root"])
    state.mkdir(parents=True, exist_ok=True)
    os.chown(state, service.pw_uid, service.pw_gid)
    os.chmod(state, 0o700)
    done.append(f"made {state} ({settings['service_user']}, 0700)")
    return done

"""The Debian packages the sandbox and its Slurm roots need on this host, installed when missing
(the one place both sandbox/cluster.py and sandbox/slurmroot.py take them from)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable

from ..hooks.errors import TetherError
from ..system.proc import CommandError, run_command


class PackageError(TetherError):
    """A Debian package the sandbox needs could not be installed."""


def ensure_packages(packages: Iterable[str], *, log=print) -> None:
    """apt-get install the Debian packages that are not installed yet."""
    missing = []
    for pkg in packages:
        probe = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                               text=True)
        if "install ok installed" not in probe.stdout:
            missing.append(pkg)
    if not missing:
        return
    log(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # packages with a daemon (docker-registry listens on every address by default) are installed
    # without starting it: policy-rc.d answers "denied" while apt runs (kept if the host has one)
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:
        policy.write_text("#!/bin/sh\n# tether sandbox: no daemon starts while packages install\nexit 101\n")
        policy.chmod(0o755)
    try:
        run_command(["apt-get", "update", "-q"], env=env, timeout=600)
        run_command(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env,
                    timeout=1800)
    except CommandError as exc:
        raise PackageError(f"could not install {' '.join(missing)}: {exc}") from None
    finally:
        if own_policy:
            policy.unlink(missing_ok=True)

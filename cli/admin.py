"""``tether slurm build|install`` and ``tether pbs install``: an admin's setup commands.

tether.admin is imported when one of these runs, not when ``tether`` starts: its builds pull in
cffi and the sandbox's dependencies, ~80 ms of imports (measured with ``python -X importtime``) that
every ``tether plan`` or ``tether run`` would otherwise pay.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..hooks.configfile import load_config
from .common import EXIT_OK, config_arg


def slurm(args: argparse.Namespace) -> int:
    from ..admin.slurm import build_plugins, install_plugins

    if args.action == "build":
        build_plugins(args.out, verbose=args.verbose, log=print)
    else:
        install_plugins(args.build_dir, slurm_conf=args.slurm_conf, plugin_dir=args.plugin_dir,
                        config=load_config(config_arg(args)), write=args.write, log=print)
    return EXIT_OK


def pbs(args: argparse.Namespace) -> int:
    from ..admin.pbs import install

    config = load_config(config_arg(args))                 # refuse to install a broken config
    install(config, hook_dir=Path(args.hook_dir), libexec=Path(args.libexec), apply=args.apply, log=print)
    return EXIT_OK


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("slurm", help="build and install the Slurm plugins (SPANK and job_submit)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="compile both plugins against the installed Slurm headers")
    build.add_argument("--out", metavar="DIR", help="output directory (default /opt/tether/lib/slurm-<version>)")
    build.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    build.set_defaults(func=slurm)
    inst = actions.add_parser("install", parents=[common],
                              help="print what installing the plugins takes (--write: do it)")
    inst.add_argument("--build-dir", metavar="DIR",
                      help="what `tether slurm build` produced (default /opt/tether/lib/slurm-<version>)")
    inst.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf (default $SLURM_CONF, else /etc/slurm/slurm.conf)")
    inst.add_argument("--plugin-dir", metavar="DIR",
                      help="where the .so files go (default: the last directory of slurm.conf's PluginDir)")
    inst.add_argument("--write", action="store_true",
                      help="install the plugins and the launcher, edit slurm.conf and plugstack.conf")
    inst.set_defaults(func=slurm)

    p = sub.add_parser("pbs", help="install tether's PBS hooks")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    inst = actions.add_parser("install", parents=[common],
                              help="print what installing the hooks takes on this host (--apply: do it)")
    inst.add_argument("--hook-dir", metavar="DIR", default="/etc/tether",
                      help="where the hooks' JSON configs go (default /etc/tether)")
    inst.add_argument("--libexec", metavar="DIR", default="/opt/tether/libexec",
                      help="where tether-jobdirs and the container launcher go (default /opt/tether/libexec)")
    inst.add_argument("--apply", action="store_true",
                      help="build and write this host's files and run the qmgr commands")
    inst.set_defaults(func=pbs)

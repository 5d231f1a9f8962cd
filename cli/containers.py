"""``tether run`` and ``tether images``: containers by hand, and the image cache."""

from __future__ import annotations

import argparse
import os
import time

from ..container.images import ImageCache, user_cache_dir
from ..container.run import container_settings, run_container
from ..hooks.configfile import load_config
from ..hooks.surface import CONTAINER_OPTIONS
from .common import EXIT_OK, EXIT_USAGE, config_arg, err


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        err("tether run: give the command to run in the container after --")
        return EXIT_USAGE
    env = dict(os.environ)
    for opt in CONTAINER_OPTIONS:                 # the srun/sbatch options, the same TETHER_* variables
        value = getattr(args, opt.name.replace("-", "_"))
        if value is True:
            env[opt.env] = "1"
        elif value:
            env[opt.env] = value
    run_container(env, command, container_settings(config_arg(args)))


def images(args: argparse.Namespace) -> int:
    settings = load_config(config_arg(args)).data["container"]
    cache = ImageCache(settings["apptainer_image_root"],
                       user_dir=user_cache_dir(settings["user_image_cache"], os.getuid(), os.environ.get("HOME")))
    if args.action == "ls":
        print(f"{'SIZE':>10}  {'LAST USED':<16}  {'OWNER':>6}  SOURCE  PATH")
        for image in cache.entries():
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(image.last_used))
            print(f"{image.size:>10}  {used:<16}  {image.owner:>6}  {image.source}  {image.path}")
        return EXIT_OK
    for path in cache.prune(args.older_than):
        print(f"removed {path}")
    return EXIT_OK


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common],
                       help="run a command in a container as tether's SPANK plugin and PBS hooks do "
                            "(options default to the TETHER_CONTAINER_* variables)")
    for opt in CONTAINER_OPTIONS:
        if opt.kind == "flag":
            p.add_argument(opt.flag, action="store_true", help=f"{opt.usage}; environment ${opt.env}")
        else:
            p.add_argument(opt.flag, metavar=opt.arginfo, help=f"{opt.usage}; environment ${opt.env}")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    p.set_defaults(func=run)

    p = sub.add_parser("images", help="the Apptainer/Singularity image cache")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("ls", parents=[common], help="list the converted images you can use").set_defaults(func=images)
    prune = actions.add_parser("prune", parents=[common],
                               help="remove images unused for DAYS (yours; all as root) and leftovers of failed "
                                    "conversions")
    prune.add_argument("--older-than", type=float, default=30.0, metavar="DAYS")
    prune.set_defaults(func=images)

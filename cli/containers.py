"""``tether run`` and ``tether images``: containers by hand, and the image cache."""

from __future__ import annotations

import argparse
import os
import time

from ..container.launch import EXIT_LAUNCH_FAILED
from ..container.run import container_settings, run_container
from ..container.scripts import ENV_FILE_VAR, PER_HOST_VARS, read_env_file
from ..hooks.configfile import load_config
from ..hooks.surface import CONTAINER_OPTIONS, RUNTIMES
from .common import EXIT_OK, EXIT_USAGE, config_arg, err


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        err("no command: tether run [OPTIONS] -- COMMAND [ARGS...]")
        return EXIT_USAGE
    env = dict(os.environ)
    if ENV_FILE_VAR in env:                       # a host of tether's PBS launch script: the job's variables
        from ..container.spec import LaunchError

        try:
            env.update({k: v for k, v in read_env_file(env.pop(ENV_FILE_VAR)).items()
                        if k not in PER_HOST_VARS or k not in env})
        except LaunchError as exc:
            err(str(exc))
            return EXIT_LAUNCH_FAILED
    for opt in CONTAINER_OPTIONS:                 # the srun/sbatch options, the same TETHER_* variables
        value = getattr(args, opt.name.replace("-", "_"))
        if value is True:
            env[opt.env] = "1"
        elif value:
            env[opt.env] = value
    run_container(env, command, container_settings(config_arg(args)))


def _image_runtimes(settings, names):
    """(name, adapter) for the runtimes ``tether images`` covers: those named, else every runtime
    whose program is on this node (Apptainer's cache also without it: it is only files)."""
    import shutil

    from ..container.runtimes import adapter
    from ..hooks.surface import RUNTIMES

    chosen = names or [r for r in RUNTIMES if r == "apptainer"
                       or shutil.which((settings.get(r) or {}).get("binary") or r)]
    return [(name, adapter(name, settings.get(name) or {}, image_root=settings["apptainer_image_root"],
                           user_image_cache=settings.get("user_image_cache"))) for name in chosen]


def human_size(size: int) -> str:
    """Bytes as podman and the conversion messages show them: decimal units, one decimal."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def images(args: argparse.Namespace) -> int:
    from ..container.spec import LaunchError

    settings = load_config(config_arg(args)).data["container"]
    env = dict(os.environ)
    try:
        if args.action == "pull":
            runtime = args.runtime or settings["runtime"]
            (_, adapter), = _image_runtimes(settings, [runtime])
            print(adapter.pull(args.image, env))
            return EXIT_OK
        runtimes = _image_runtimes(settings, [args.runtime] if args.runtime else [])
        if args.action == "ls":
            rows = [(name, human_size(image.size), time.strftime("%Y-%m-%d %H:%M", time.localtime(image.last_used)),
                     image.name, image.where) for name, adapter in runtimes for image in adapter.stored(env)]
            widths = [max(len(str(c)) for c in column) for column in
                      zip(("RUNTIME", "SIZE", "LAST USED", "IMAGE", "WHERE"), *rows)]
            for row in [("RUNTIME", "SIZE", "LAST USED", "IMAGE", "WHERE"), *rows]:
                print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  "
                      f"{row[3]:<{widths[3]}}  {row[4]}".rstrip())
            return EXIT_OK
        for name, adapter in runtimes:
            for removed in adapter.prune(args.older_than, env):
                print(f"{name}: removed {removed}")
    except LaunchError as exc:
        err(f"images: {exc}")
        return 1
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

    p = sub.add_parser("images", help="your images on this node: the Apptainer/Singularity cache, your podman "
                                      "and enroot stores")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    runtime = argparse.ArgumentParser(add_help=False)
    runtime.add_argument("--runtime", choices=RUNTIMES, help="only this runtime's images (default: every runtime "
                                                             "on this node; pull: the config's runtime)")
    actions.add_parser("ls", parents=[common, runtime],
                       help="the images you can use on this node; DATE is the last use (podman: the last "
                            "container tether started of it, else when the image was made)").set_defaults(func=images)
    pull = actions.add_parser("pull", parents=[common, runtime],
                              help="fetch an image into your store on this node as a first container would "
                                   "(Apptainer as root: into the shared cache)")
    pull.add_argument("image", metavar="IMAGE")
    pull.set_defaults(func=images)
    prune = actions.add_parser("prune", parents=[common, runtime],
                               help="remove images unused for DAYS (never one a container uses) and leftovers "
                                    "of failed imports/conversions (yours; the shared Apptainer cache as root)")
    prune.add_argument("--older-than", type=float, default=30.0, metavar="DAYS")
    prune.set_defaults(func=images)

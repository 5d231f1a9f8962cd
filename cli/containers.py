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


def _cluster_store(settings):
    """The cluster image store of ``container.cluster_store`` (None: none configured)."""
    from ..container.imagestore import ImageStore

    return ImageStore.configured(settings.get("cluster_store"))


def _as_account(store, what: str) -> None:
    """Only the store's account writes it: root becomes it (a login shell's environment is not
    taken along), anyone else is refused."""
    import pwd

    from ..container.imagestore import StoreError

    if os.getuid() == store.owner:
        return
    if os.getuid() != 0:
        raise StoreError(f"{what}: only the store's account ({pwd.getpwuid(store.owner).pw_name}) or root may")
    account = pwd.getpwuid(store.owner)
    os.setgroups([])
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)


def cluster_images(args: argparse.Namespace) -> int:
    """tether images setup | gc | rm | serve: the cluster image store, the admin's and its service's."""
    from ..container import imageservice
    from ..container.imagestore import StoreError

    settings = load_config(config_arg(args)).data["container"]
    conf = settings.get("cluster_store") or {}
    try:
        store = _cluster_store(settings)
        if store is None:
            err("images: no cluster image store is configured (container.cluster_store.root)")
            return EXIT_USAGE
        _as_account(store, f"tether images {args.action}")
        if args.action == "setup":
            store.setup()
            print(f"cluster image store ready: {store.root}")
        elif args.action == "gc":
            for info in store.gc(conf["max_gib"] << 30, conf["keep_days"] * 86400.0):
                print(f"removed {info.image_id[:12]} ({human_size(info.size)}; {', '.join(info.references)})")
        elif args.action == "rm":
            matches = [i for i in store.images()
                       if i.image_id.startswith(args.image) or args.image in i.references]
            if len(matches) != 1 or len(args.image) < 4:
                err(f"images rm: {args.image} names {len(matches)} images of the cluster store")
                return 1
            store.remove(matches[0].image_id)
            print(f"removed {matches[0].image_id[:12]}")
        else:
            return imageservice.serve(store, settings, listen=args.listen)
    except (StoreError, OSError) as exc:
        err(f"images: {exc}")
        return 1
    return EXIT_OK


def _cluster_rows(settings) -> list[tuple]:
    import pwd

    from ..container.imagestore import StoreError

    try:
        store = _cluster_store(settings)
        infos = store.images() if store else []
    except PermissionError:
        return []                   # its images are listed to root and the store's account only
    except (StoreError, OSError) as exc:
        err(f"images: the cluster image store: {exc}")
        return []

    def names(uids):
        out = []
        for uid in uids:
            try:
                out.append(pwd.getpwuid(uid).pw_name)
            except KeyError:
                out.append(str(uid))
        return ",".join(out) or "-"

    return [("cluster", human_size(i.size), time.strftime("%Y-%m-%d %H:%M", time.localtime(i.last_used)),
             ", ".join(i.references) or i.image_id[:12], f"{i.image_id[:12]} users {names(i.users)}")
            for i in infos]


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
            if not args.runtime or args.runtime == "podman":
                rows += _cluster_rows(settings)
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
    # the cluster image store (container.cluster_store): its account's, or root's as that account
    actions.add_parser("setup", parents=[common],
                       help="make the cluster image store's directories (root or the store's account)"
                       ).set_defaults(func=cluster_images)
    actions.add_parser("gc", parents=[common],
                       help="remove the cluster store's least recently used images above max_gib, never one "
                            "used within keep_days, and what killed fetches left").set_defaults(func=cluster_images)
    rm = actions.add_parser("rm", parents=[common], help="remove an image from the cluster store (running "
                                                         "containers keep theirs; the next rank fetches it again)")
    rm.add_argument("image", metavar="ID|REFERENCE")
    rm.set_defaults(func=cluster_images)
    serve = actions.add_parser("serve", parents=[common],
                               help="the image service, as the store's account: one connection on stdin "
                                    "(systemd's tether-images.socket, Accept=yes), or --listen")
    serve.add_argument("--listen", metavar="SOCKET", help="accept connections on this unix socket itself")
    serve.set_defaults(func=cluster_images)

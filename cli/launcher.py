"""``tether submit|status|logs|cancel|cleanup|list``, ``tether launcher install`` and ``tether serve``:
the launcher (docs/requirements.md, "The launcher"), run by its service account."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..hooks.configfile import load_config, load_yaml
from ..hooks.errors import ConfigError
from ..launcher.states import ENDED
from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config_arg, err

ENDED_STATES = ENDED | {"UNKNOWN"}     # what `status --wait` stops at (UNKNOWN: the scheduler forgot it)


def _launcher(args: argparse.Namespace):
    """The launcher, for its service account only (another account cannot read its records nor
    act through its sudo policy; root is refused by the launcher itself)."""
    import os
    import pwd

    from ..launcher.service import Launcher, LauncherError

    config = load_config(config_arg(args))
    service = config.data["launcher"]["service_user"]
    uid = os.geteuid()
    try:
        me = pwd.getpwuid(uid).pw_name
    except KeyError:
        me = f"uid {uid}"
    if uid != 0 and me != service:
        raise LauncherError(f"tether {args.command_name} and the other launcher commands run as the launcher's "
                            f"service account {service} (you are {me}): users go through its service (`tether "
                            f"serve`); an admin runs `sudo -u {service} tether {args.command_name} ...`", 403)
    return Launcher(config)


def _show(record, as_json: bool) -> None:
    if as_json:
        print(json.dumps(record, indent=1, sort_keys=True))
        return
    if isinstance(record, list):
        print(f"{'ID':<24} {'USER':<12} {'JOB':<10} {'STATE':<10} NAME")
        for r in record:
            print(f"{r['id']:<24} {r['user']:<12} {str(r.get('job_id') or '-'):<10} {r['state']:<10} {r['job_name']}")
        return
    for key in ("id", "user", "job_name", "job_id", "state", "exit_code", "reason", "tree"):
        if record.get(key) not in (None, ""):
            print(f"{key}: {record[key]}")
    if record.get("cancel_requested") and record.get("state") not in ENDED_STATES:
        when = time.strftime("%H:%M:%S", time.localtime(record["cancel_requested"]))
        print(f"cancel: requested at {when}; the scheduler is ending the job (`tether status --wait ID`)")
    if record.get("tree_removed"):
        print("tree: removed")
    if record.get("startup_failure"):
        print("startup failure (the end of the error log):")
        print("  " + record["startup_failure"].replace("\n", "\n  "))


def _call(args: argparse.Namespace, action) -> int:
    from ..launcher.service import LauncherError

    try:
        result = action(_launcher(args))
    except LauncherError as exc:
        err(str(exc))
        return EXIT_USAGE if exc.status in (400, 409) else EXIT_FAIL
    except OSError as exc:                          # not foreseen: still one line, never a traceback
        err(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        return EXIT_FAIL
    if result is not None:
        _show(result, getattr(args, "json", False))
    return EXIT_OK


def submit(args: argparse.Namespace) -> int:
    source = "<stdin>" if args.spec == "-" else args.spec
    try:
        text = sys.stdin.read() if args.spec == "-" else open(args.spec, encoding="utf-8").read()
        data = load_yaml(text, source)
    except OSError as exc:
        err(f"cannot read job spec {source}: {exc.strerror}")
        return EXIT_USAGE
    except UnicodeDecodeError:
        err(f"cannot read job spec {source}: not UTF-8 text (a YAML or JSON job spec)")
        return EXIT_USAGE
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    return _call(args, lambda launcher: launcher.submit(data))


def status(args: argparse.Namespace) -> int:
    def look(launcher):
        record = launcher.status(args.id)
        while args.wait and record["state"] not in ENDED_STATES:
            time.sleep(2)
            record = launcher.status(args.id)
        return record

    return _call(args, look)


def logs(args: argparse.Namespace) -> int:
    def show(launcher):
        result = launcher.logs(args.id)
        if args.json:
            return result
        if result.get("startup_failure"):
            print("--- the job failed before its command ran; the end of its error log:")
            print(result["startup_failure"])
            return None
        for which in ("out", "err"):
            if result.get(which):
                stream = sys.stdout if which == "out" else sys.stderr
                stream.write(result[which])
        return None

    return _call(args, show)


def cancel(args: argparse.Namespace) -> int:
    return _call(args, lambda launcher: launcher.cancel(args.id))


def cleanup(args: argparse.Namespace) -> int:
    return _call(args, lambda launcher: launcher.cleanup(args.id))


def list_jobs(args: argparse.Namespace) -> int:
    return _call(args, lambda launcher: launcher.list())


def install(args: argparse.Namespace) -> int:
    from ..launcher import install as inst

    config = load_config(config_arg(args))
    if not args.apply:
        print("# tether launcher install would (run it again with --apply, as root):")
        for line in inst.plan(config):
            print("- " + line.replace("\n", "\n    "))
        return EXIT_OK
    try:
        for line in inst.apply(config):
            print(line)
    except (PermissionError, LookupError, ValueError, OSError) as exc:
        err(str(exc))
        return EXIT_FAIL
    return EXIT_OK


def serve(args: argparse.Namespace) -> int:
    from ..launcher.rest import serve as run

    return run(load_config(config_arg(args)), socket_path=args.socket, tcp=args.tcp, token_file=args.token_file,
               tls_cert=args.tls_cert, tls_key=args.tls_key)


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("submit", parents=[common], help="launcher: submit a job spec as its user")
    p.add_argument("spec", metavar="SPEC.yaml", help="launcher job spec (YAML or JSON); - reads stdin")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.set_defaults(func=submit, command_name="submit")
    for name, func, text in (("status", status, "a launcher job's state"),
                             ("logs", logs, "a launcher job's output and error logs"),
                             ("cancel", cancel, "cancel a launcher job (scancel/qdel as its user)"),
                             ("cleanup", cleanup, "remove a launcher job's tree and record")):
        p = sub.add_parser(name, parents=[common], help=f"launcher: {text}")
        p.add_argument("id", metavar="ID", help="the launcher job id (from tether submit)")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "status":
            p.add_argument("--wait", action="store_true", help="until the job has ended")
        p.set_defaults(func=func, command_name=name)
    p = sub.add_parser("list", parents=[common], help="launcher: every job it keeps a record of")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=list_jobs, command_name="list")
    launcher = sub.add_parser("launcher", help="set up the launcher service")
    launcher_sub = launcher.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = launcher_sub.add_parser("install", parents=[common],
                                help="print (or, with --apply, write) the sudo policy, the agent and directories")
    p.add_argument("--apply", action="store_true", help="do it (as root)")
    p.set_defaults(func=install)
    p = sub.add_parser("serve", parents=[common], help="launcher: the private REST interface")
    p.add_argument("--socket", metavar="PATH", help="unix socket (default: launcher.socket)")
    p.add_argument("--tcp", metavar="127.0.0.1:PORT", help="loopback TCP instead (a bearer token and TLS are required)")
    p.add_argument("--token-file", metavar="FILE", help="with --tcp: the file holding the bearer token")
    p.add_argument("--tls-cert", metavar="PEM",
                   help="with --tcp (required): serve HTTPS with this certificate, which clients verify")
    p.add_argument("--tls-key", metavar="PEM", help="with --tls-cert: its private key")
    p.set_defaults(func=serve)

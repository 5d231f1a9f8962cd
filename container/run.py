"""``tether run`` and the slurmstepd hand-off: one path from a task's environment to a container.

The SPANK plugin hands each task of a container step to the launcher that ``tether slurm install``
writes next to it (``tether-run``; the PBS MoM hook does the same for TM tasks, see
tether.pbs_hooks.mom). On Slurm 23.11 and later it puts the launcher in front of the task's argv
(``spank_prepend_task_argv``) and sets ``TETHER_RUN_ARGV0`` empty: the command is ``argv[1:]``.
Slurm 22.05 and PBS let a plugin change argv entries, not insert new ones: the task's ``argv[0]``
becomes the launcher's path and the original travels in ``TETHER_RUN_ARGV0``, so the command is
``[$TETHER_RUN_ARGV0, *argv[1:]]``. The launcher starts Python
with ``-I -S`` and imports only this package and the one runtime adapter: it runs once per rank.

The container settings (``container:`` of tether's config) are baked into the launcher (as a Python
literal: no JSON or YAML parser to import) with the
config file's identity (inode, size, mtime); when the file has changed since, the launcher reads it
again (slower, always current).
"""

from __future__ import annotations

import os
import sys
TYPE_CHECKING = False  # not `typing`: importing it costs each rank milliseconds

from ..hooks.surface import AHEAD_VAR, BATCH_VAR, CLEANUP_VAR, GATEWAYS_RUN_VAR, RESUME_VAR, RUN_ARGV0, SUBREAPER_VAR
from .environment import DEFAULT_MODE
from .launch import EXIT_LAUNCH_FAILED, execute, report, report_admin
from .runtimes import adapter
from .spec import LaunchError, check_mount_sources, check_save_target, spec_from_env

if TYPE_CHECKING:
    from typing import Any, Mapping, NoReturn, Sequence

LAUNCHER_NAME = "tether-run"      # the C rank launcher, next to the SPANK plugin / in PBS's libexec
PYTHON_LAUNCHER_NAME = "tether-run-py"   # this launcher, which it hands everything but its own case to
ARGV0_VAR = RUN_ARGV0
# the launcher protocol's names are surface.LAUNCHER_VAR's: SUBREAPER_VAR; CLEANUP_VAR (cleanup mode:
# slurmstepd, after a container step, see launch.py); RESUME_VAR (the C rank launcher ran the
# container: conclude it, launch.parse_resume)


def config_identity(path: str | None) -> list[int] | None:
    """What identifies a config file's content cheaply: [inode, size, mtime_ns], or None if absent."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def container_settings(config_path: str | None) -> dict[str, Any]:
    """The ``container`` section of the effective config (the slow path: YAML and validation; not
    imported at the top: the launcher's fast path reads the settings baked into it)."""
    from ..hooks.configfile import load_config

    return dict(load_config(config_path).data["container"])


def runtime_for(name: str, settings: Mapping[str, Any]):
    """The adapter of runtime ``name`` with the ``container`` settings, as a rank's launch has it."""
    return adapter(name, settings.get(name) or {},
                   image_root=settings.get("apptainer_image_root", "/var/cache/tether/images"),
                   user_image_cache=settings.get("user_image_cache"),
                   environment=settings.get("environment") or DEFAULT_MODE,
                   cluster_store=settings.get("cluster_store"))


def run_container(env: Mapping[str, str], command: Sequence[str], settings: Mapping[str, Any], *,
                  subreaper: bool = False, resume: str | None = None, ahead: bool = False) -> NoReturn:
    """Start the container for ``command`` as ``env``'s TETHER_CONTAINER_* describe; never returns.
    ``subreaper``: the caller made this process a child subreaper already; ``resume``: the C rank
    launcher started it already (see RESUME_VAR); ``ahead``: the C rank launcher started its
    preparation's first step (see AHEAD_VAR)."""
    try:
        spec = spec_from_env(env, command, default_runtime=settings["runtime"], defaults=settings)
        check_mount_sources(spec.mounts, settings.get("mounts") or ())
        if spec.save:
            check_save_target(spec.save)
        launch = runtime_for(spec.runtime, settings).launch(spec, env)
    except LaunchError as exc:
        report(str(exc))
        os._exit(EXIT_LAUNCH_FAILED)
    execute(launch, subreaper=subreaper, resume=resume, ahead=ahead)


def task_command(argv0: str | None, argv: Sequence[str]) -> list[str]:
    """The task's command from the launcher's own argv: ``argv[1:]`` where Slurm prepended the
    launcher (``argv0`` empty), ``[argv0, *argv[1:]]`` where it replaced the task's argv[0]; empty
    when the launcher was not handed a task (``argv0`` None) or the command is."""
    if argv0 is None:
        return []
    return [argv0, *argv[1:]] if argv0 else list(argv[1:])


def handoff(config_path: str | None, identity: list[int] | None, baked: Mapping[str, Any]) -> NoReturn:
    """The launcher's entry point (see the module docstring)."""
    env = dict(os.environ)
    argv0 = env.pop(ARGV0_VAR, None)
    resume = env.pop(RESUME_VAR, None)
    ahead = env.pop(AHEAD_VAR, None) == "1"
    try:
        # a launcher written by another tether version may bake something else: read the config
        if isinstance(baked, dict) and config_identity(config_path) == identity:
            settings = baked
        else:
            settings = container_settings(config_path)
    except Exception as exc:                       # a broken config: say so in the job's output
        report(f"cannot read tether's configuration: {exc}")
        os._exit(EXIT_LAUNCH_FAILED)
    if CLEANUP_VAR in env:                         # run by slurmstepd / tether-jobdirs after a step
        from .cleanup import run_leftovers

        sys.exit(run_leftovers(env[CLEANUP_VAR], settings))
    command = task_command(argv0, sys.argv)
    if not command:
        report(f"{sys.argv[0]} is tether's container launcher: it runs tasks handed over by the "
               f"SPANK plugin or the PBS MoM hook; use `tether run` by hand")
        os._exit(EXIT_LAUNCH_FAILED)
    if GATEWAYS_RUN_VAR in env:                   # a batch script with gateway nodes: them first
        env.update(batch_gateways(config_path, env.pop(GATEWAYS_RUN_VAR)))
        if env.get(BATCH_VAR) != "1":              # the script itself on the host
            os.environ.clear()
            os.environ.update(env)
            try:
                os.execv(command[0], command)
            except OSError as exc:
                report(f"cannot run the batch script {command[0]}: {exc.strerror}")
                os._exit(EXIT_LAUNCH_FAILED)
    try:
        # the SPANK plugin made this process a child subreaper; PBS's hook cannot (TETHER_RUN_SUBREAPER=0)
        subreaper = env.pop(SUBREAPER_VAR, "1") != "0"
        run_container(env, command, settings, subreaper=subreaper, resume=resume, ahead=ahead)
    except Exception as exc:                       # never a bare traceback in the user's output
        import traceback

        report(f"internal error in tether's container launcher ({type(exc).__name__}: {exc}); "
               f"details in the system log")
        report_admin(traceback.format_exc())
        os._exit(EXIT_LAUNCH_FAILED)


def batch_gateways(config_path: str | None, component: str) -> dict[str, str]:
    """Start the gateway daemons of a batch script's job (tether.container.gateways): the
    variables for its environment; on a failure the script does not run (exit 1, the reason in
    the job's error output, the node in service)."""
    from .gateways import GatewayError, start_gateways

    try:
        from ..hooks.configfile import load_config

        settings = load_config(config_path).data["gateways"]
        return start_gateways(os.environ, int(component), settings)
    except (GatewayError, ValueError) as exc:
        report(f"the job's gateway nodes: {exc}")
    except Exception as exc:                       # a broken config included: never a traceback
        report(f"the job's gateway nodes could not be set up ({type(exc).__name__}: {exc})")
    os._exit(1)


LAUNCHER_TEMPLATE = """\
#!{python} -IS
# tether's container launcher, written by `tether slurm|pbs install`; do not edit (run it again).
import sys
sys.path[:0] = {paths!r}
from tether.container.run import handoff
handoff({config!r}, {identity!r}, {baked!r})
"""


def baked_identity(path) -> tuple[str | None, list[int] | None] | None:
    """(config path, identity) baked into an installed Python launcher (``LAUNCHER_TEMPLATE``'s
    handoff line; the C launcher beside it was built with the same), or None when unreadable."""
    import ast

    try:
        with open(path, encoding="utf-8") as fh:
            line = next((l for l in fh if l.startswith("handoff(")), None)
        call = ast.parse(line or "").body[0].value
        return ast.literal_eval(call.args[0]), ast.literal_eval(call.args[1])
    except (OSError, SyntaxError, ValueError, IndexError, AttributeError, UnicodeDecodeError):
        return None


def launcher_text(config_path: str | None, settings: Mapping[str, Any], *, python: str | None = None,
                  paths: Sequence[str] | None = None, bake_identity: bool = True) -> str:
    """The launcher script for this Python and the given config (install time only: imports
    tether's config and toolchain modules, which a rank's launch never needs). ``paths``: its
    sys.path (default: where this tether and its dependencies are imported from); without
    ``bake_identity`` it is written as if the config file did not exist (a package built on another
    host: the build host's file says nothing of the target's)."""
    from ..hooks.config import plain_data
    from ..system.toolchain import dependency_dirs, tether_import_path

    # -S: no site.py, so also where yaml comes from (Debian's python3-yaml: /usr/lib/python3/dist-packages,
    # which only Debian's site.py adds); a changed config is read again with it
    if paths is None:
        paths = [tether_import_path(), *dependency_dirs()]
    # plain dicts, lists and strings: their repr() is a Python literal
    return LAUNCHER_TEMPLATE.format(python=python or sys.executable, paths=list(dict.fromkeys(paths)),
                                    config=config_path,
                                    identity=config_identity(config_path) if bake_identity else None,
                                    baked=plain_data(settings))

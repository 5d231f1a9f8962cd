"""PBS server hooks: queuejob (qsub) and modifyjob (qalter) rewrite a tether job's resources.

A tether job asks with custom resources (created by the admin, see the README):
``-l tether_slots=N`` (``slots_per_trial``), ``-l tether_slots_per_node=N``, ``-l tether_slot_type=cuda|rocm|cpu``,
``-l tether_gpu_type=T``; ``-q QUEUE`` is the resource pool. The core planner computes the seed's
PBS row; the hook sets ``Resource_List["select"]`` (the user's other chunk resources kept, chunk count
and ngpus/ncpus replaced -- each replacement logged and put in the job's comment),
``place=scatter`` (one container per host), ``Rerunable`` off, ``umask`` 0022, the project (from
``job_project_source``) and, in queuejob, the queue from the resource pool. Jobs without tether
resources are accepted untouched; an invalid request is rejected with the message qsub shows; an
internal error rejects tether jobs ("tether unavailable: ...", details in the server log) -- never a
silent accept.
"""

from __future__ import annotations

import traceback
from typing import Any

from . import RESOURCES

UMASK_0022 = 0o022


def tether_values(resource_list: Any, original: Any = None) -> dict[str, Any]:
    """Request field -> value from a job's Resource_List (qalter: the changes over the original)."""
    values = {}
    for resource, (field, _) in RESOURCES.items():
        value = resource_list[resource]
        if value is None and original is not None:
            value = original[resource]
        if value is not None:
            values[field] = value
    return values


def container_values(variables: Any) -> dict[str, str]:
    """--container-* option name -> value from the job's ``-v TETHER_CONTAINER_*`` variables."""
    from tether.spank.options import BY_NAME, CONTAINER_OPTIONS

    values = {}
    for name in CONTAINER_OPTIONS:
        try:
            value = variables[BY_NAME[name].env]
        except (KeyError, TypeError):
            value = None
        if value is not None:
            values[name] = str(value)
    return values


def pbs_spelling(message: str) -> str:
    """A run-side message as a PBS user wrote the option: ``--container-image`` -> ``TETHER_CONTAINER_IMAGE``."""
    from tether.spank.options import BY_NAME, CONTAINER_OPTIONS

    for name in sorted(CONTAINER_OPTIONS, key=len, reverse=True):
        message = message.replace(f"--{name}", BY_NAME[name].env)
    return message.replace("--container-*", "TETHER_CONTAINER_*")


def _count(value: Any, name: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        from tether.hooks.errors import RequestError

        raise RequestError(f"-l {name}={value}: expected a whole number") from None


def submit(pbs: Any, e: Any, config_path: str | None) -> None:
    """queuejob / modifyjob: plan the job's resources (ends the hook: accept or reject)."""
    job = e.job
    original = e.job_o.Resource_List if e.type == pbs.MODIFYJOB and e.job_o is not None else None
    values = tether_values(job.Resource_List, original)
    changed = job.Variable_List or {}
    variables = dict(changed)
    if e.type == pbs.MODIFYJOB and e.job_o is not None:    # qalter -v: the changes over the job's own
        variables = {**dict(e.job_o.Variable_List or {}), **variables}
    if not values and not any(str(name).startswith("TETHER_CONTAINER_") for name in changed):
        e.accept()                                   # not a tether job, or nothing tether checks changed
    from tether.container.spec import LaunchError, check_container_options
    from tether.hooks.config import load_config
    from tether.hooks.errors import RequestError, TetherError
    from tether.hooks.plan import make_plan
    from tether.hooks.policy import PBS_JOBWIDE_FORBIDDEN
    from tether.hooks.request import Request

    try:
        config = load_config(config_path)
        try:
            check_container_options(container_values(variables), config.data["container"]["runtime"])
        except LaunchError as exc:
            raise RequestError(pbs_spelling(str(exc))) from None
        if not values:
            e.accept()                               # container options only: nothing to plan
        select = job.Resource_List["select"] or (original["select"] if original is not None else None)
        place = job.Resource_List["place"] or (original["place"] if original is not None else None)
        args: list[str] = []
        if select:
            args += ["-l", f"select={select}"]
        if place:
            args += ["-l", f"place={place}"]
        # job-wide resources the select statement owns, as this request gives them (not the
        # original job's: the server derives ncpus and nodect from select after queuejob)
        for name in PBS_JOBWIDE_FORBIDDEN:
            if job.Resource_List[name] is not None:
                args += ["-l", f"{name}={job.Resource_List[name]}"]
        queue = str(job.queue) if job.queue else None
        request = Request(
            slots=_count(values.get("slots", 0), "tether_slots"),
            slots_per_node=_count(values["slots_per_node"], "tether_slots_per_node")
            if "slots_per_node" in values else None,
            slot_type=str(values["slot_type"]) if "slot_type" in values else None,
            gpu_type=str(values["gpu_type"]) if "gpu_type" in values else None,
            resource_pool=queue, scheduler_args=tuple(args), origin="pbs",
            user=str(e.requestor) if e.requestor else None,
            account=str(job.Account_Name) if job.Account_Name else None,
            project=str(job.project) if job.project else None)
        if "slots" not in values:
            raise RequestError("-l tether_slots_per_node, tether_slot_type and tether_gpu_type need "
                               "-l tether_slots")
        plan = make_plan(request, config, "pbs")
        resources = dict(value.split("=", 1) for _, value in plan.resources)
        job.Resource_List["select"] = pbs.select(resources["select"])
        job.Resource_List["place"] = pbs.place(resources["place"])
        job.Rerunable = False
        job.umask = UMASK_0022
        if plan.project:
            job.project = plan.project
        if e.type == pbs.QUEUEJOB and plan.partition and not queue:
            job.queue = pbs.server().queue(plan.partition)
        if plan.notices:
            job.comment = "tether: " + "; ".join(plan.notices)
            for notice in plan.notices:
                pbs.logmsg(pbs.LOG_DEBUG, f"tether: {notice}")
    except (RequestError, ValueError) as exc:
        e.reject(f"tether: {exc}")
    except TetherError as exc:                       # a broken config
        pbs.logmsg(pbs.LOG_ERROR, f"tether: {exc}")
        e.reject(f"tether unavailable: {exc}".splitlines()[0])
    except Exception as exc:                         # never accept a tether job silently
        pbs.logmsg(pbs.LOG_ERROR, "tether: internal error:\n" + traceback.format_exc())
        e.reject(f"tether unavailable: internal error ({type(exc).__name__}); details in the PBS "
                 f"server log")
    e.accept()

"""PBS server hooks: queuejob (qsub) and modifyjob (qalter) rewrite a tether job's resources.

A tether job asks with custom resources (``tether pbs install`` creates them):
``-l tether_slots=N`` (``slots_per_trial``), ``-l tether_slots_per_node=N``, ``-l tether_slot_type=cuda|rocm|cpu``,
``-l tether_gpu_type=T``; ``-q QUEUE`` is the resource pool. The core planner computes the PBS
table's row; the hook sets ``Resource_List["select"]`` (the user's other chunk resources kept, chunk count
and ngpus/ncpus replaced -- each replacement logged and put in the job's comment),
``place=scatter`` (one container per host), ``Rerunable`` off, ``umask`` 0022, the project (from
``job_project_source``) and, in queuejob, the queue from the resource pool. Jobs without tether
resources are accepted untouched; an invalid request is rejected with the message qsub shows; an
internal error rejects tether jobs ("tether unavailable: ...", details in the server log) -- never a
silent accept.

Attributes are read as the real pbs module gives them (tether.pbs_hooks.attrs);
``e.accept()``/``e.reject()`` raise SystemExit and end the hook.
"""

from __future__ import annotations

import traceback
from typing import Any

from ..container.spec import LaunchError, check_container_options
from ..hooks.config import Config, validate_config
from ..hooks.errors import RequestError, TetherError
from ..hooks.plan import make_plan
from ..hooks.policy import PBS_JOBWIDE_FORBIDDEN, PbsUserRequest
from ..hooks.render import pbs_place, pbs_select
from ..hooks.request import Request
from ..hooks.surface import BY_NAME, CONTAINER_OPTIONS, PBS_RESOURCES
from .attrs import resource, variable

UMASK_0022 = 0o022


def tether_values(resource_list: Any, original: Any = None) -> dict[str, Any]:
    """Request field -> value from a job's Resource_List (qalter: the changes over the original)."""
    values = {}
    for opt in PBS_RESOURCES:
        value = resource(resource_list, opt.pbs_resource)
        if value is None:
            value = resource(original, opt.pbs_resource)
        if value is not None:
            values[opt.field] = value
    return values


def container_values(variables: Any) -> dict[str, str]:
    """--container-* option name -> value from the job's ``-v TETHER_CONTAINER_*`` variables."""
    values = {}
    for opt in CONTAINER_OPTIONS:
        value = variable(variables, opt.env)
        if value is not None:
            values[opt.name] = str(value)
    return values


def pbs_spelling(message: str) -> str:
    """A run-side message as a PBS user wrote the option: ``--container-image`` -> ``TETHER_CONTAINER_IMAGE``."""
    for opt in sorted(CONTAINER_OPTIONS, key=lambda o: len(o.name), reverse=True):
        message = message.replace(opt.flag, opt.env)
    return message.replace("--container-*", "TETHER_CONTAINER_*")


def _count(value: Any, name: str) -> int:
    text = str(value)
    if not (text.isascii() and text.isdigit()):
        raise RequestError(f"-l {name}={value}: expected a whole number")
    return int(text)


def user_request(job: Any, original: Any) -> PbsUserRequest:
    """What the user asked PBS for besides slots, read from the job's Resource_List: the select
    statement, the place, and the job-wide resources tether's select owns (refused when given)."""
    def value(name: str) -> Any:
        given = resource(job.Resource_List, name)
        return given if given is not None else resource(original, name)

    select, place = value("select"), value("place")
    # job-wide resources as this request gives them (not the original job's: the server derives
    # ncpus and nodect from select after queuejob)
    jobwide = tuple((name, str(resource(job.Resource_List, name))) for name in PBS_JOBWIDE_FORBIDDEN
                    if resource(job.Resource_List, name) is not None)
    return PbsUserRequest(selects=(str(select),) if select else (), places=(str(place),) if place else (),
                          jobwide=jobwide)


def request_of(e: Any, values: dict[str, Any], original: Any) -> Request:
    """The Request for a PBS job: its tether resources, queue, other resources and identity."""
    job = e.job
    if "slots" not in values:
        raise RequestError("-l tether_slots_per_node, tether_slot_type and tether_gpu_type need "
                           "-l tether_slots")
    return Request(
        slots=_count(values["slots"], BY_NAME["slots"].pbs_resource),
        slots_per_node=_count(values["slots_per_node"], BY_NAME["slots-per-node"].pbs_resource)
        if "slots_per_node" in values else None,
        slot_type=str(values["slot_type"]) if "slot_type" in values else None,
        gpu_type=str(values["gpu_type"]) if "gpu_type" in values else None,
        resource_pool=str(job.queue) if job.queue else None, qsub=user_request(job, original),
        origin="pbs", user=str(e.requestor) if e.requestor else None,
        account=str(job.Account_Name) if job.Account_Name else None,
        project=str(job.project) if job.project else None)


def load_hook_config(settings: dict) -> Config:
    """The validated config ``tether pbs install`` wrote into the hook's JSON config."""
    return validate_config(settings.get("config") or {}, settings.get("config_source") or "<hook config>")


def submit(pbs: Any, e: Any, settings: dict) -> None:
    """queuejob / modifyjob: plan the job's resources (ends the hook: accept or reject)."""
    job = e.job
    original = e.job_o.Resource_List if e.type == pbs.MODIFYJOB and e.job_o is not None else None
    values = tether_values(job.Resource_List, original)
    changed = job.Variable_List or {}
    variables = dict(changed)
    if e.type == pbs.MODIFYJOB and e.job_o is not None:    # qalter -v: the changes over the job's own
        variables = {**dict(e.job_o.Variable_List or {}), **variables}
    gateways = variable(changed, BY_NAME["gateways"].env)
    if not values and gateways is None and not any(
            str(name).startswith(("TETHER_CONTAINER_", "TETHER_NO_CONTAINER_")) for name in changed):
        e.accept()                                   # not a tether job, or nothing tether checks changed
    try:
        if gateways is not None:
            raise RequestError(f"{BY_NAME['gateways'].env}: gateway nodes are a component of a Slurm "
                               f"heterogeneous job (--gateways); tether has no PBS equivalent")
        config = load_hook_config(settings)
        try:
            container = container_values(variables)
            if container.get("container-batch", "0").lower() not in ("0", "false", "no", "off"):
                raise LaunchError("--container-batch is for Slurm: under PBS the job script stays on the host "
                                  "and its pbs_tmrsh/mpiexec tasks run in containers")
            check_container_options(container, config.data["container"]["runtime"])
        except LaunchError as exc:
            raise RequestError(pbs_spelling(str(exc))) from None
        if not values:
            e.accept()                               # container options only: nothing to plan
        plan = make_plan(request_of(e, values, original), config, "pbs")
        assert plan.pbs is not None
        job.Resource_List["select"] = pbs.select(pbs_select(plan.pbs))
        job.Resource_List["place"] = pbs.place(pbs_place(plan.pbs))
        job.Rerunable = False
        job.umask = UMASK_0022
        if plan.project:
            job.project = plan.project
        if e.type == pbs.QUEUEJOB and plan.partition and not job.queue:
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

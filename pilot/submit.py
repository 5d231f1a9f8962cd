"""``tether pilot submit PILOT.yaml``: a pilot job whose size follows from its initial partitions.

docs/requirements.md, "Pilot partitions": users forget the agents' own needs when they size a
pilot job; so the pilot's size is derived from its initial partitions, the agents' needs
included. A pilot spec::

    partitions: ["1 node", {cores: 12, config: default}]    # the initial partitions
    agent_cores: 1         # each agent's own cores (added to a cores request)
    partition: debug       # the Slurm partition, or the PBS queue (its nodes' cores size a cores request)
    time: 60               # minutes
    sbatch_args: [--account=proj]          # Slurm; on PBS: qsub_args: [-A, proj]
    script: |              # runs once the partitions are ACTIVE (default: wait until all end)
      tether partition run part.0000 -- ./simulate

``nodes:`` sets the size instead (needed when an initial partition is a share: ``50%``,
``FILL``); the initial partitions must fit it. The job gets whole nodes (Slurm ``--exclusive``,
PBS ``-l place=scatter:excl`` with one chunk of all of a node's cores per node): a partition's
cores are the node's. The script stops the partitions still running when it ends.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from typing import Any, Mapping

from ..system.proc import CommandError, run_command

from .resources import Description, Node, PartitionError, fit

SCRIPT_ENDED = "the pilot script ended"
KEYS = ("partitions", "agent_cores", "partition", "time", "sbatch_args", "qsub_args", "script", "nodes",
        "cores_per_node")
SCHEDULERS = ("slurm", "pbs")


def pilot_nodes(descriptions: list[Description], cores_per_node: int, agent_cores: int = 0) -> int:
    """The nodes the initial partitions need: whole-node requests add up; cores requests (each
    with its agent's cores) are packed onto nodes of ``cores_per_node``."""
    nodes, cores = 0, 0
    for d in descriptions:
        if d.nodes:
            nodes += d.nodes
        elif d.cores:
            cores += d.cores + agent_cores
        else:
            raise PartitionError(f"{d.text()}: a share of the allocation cannot size a pilot; give nodes: "
                                 f"in the pilot spec, or nodes/cores for each initial partition")
    return nodes + (math.ceil(cores / cores_per_node) if cores else 0)


def pilot_job(spec: Mapping[str, Any], cores_per_node: int, scheduler: str = "slurm") -> tuple[list[str], str]:
    """sbatch's (or qsub's) arguments and the batch script for a pilot spec (PartitionError when
    it is not one)."""
    if not isinstance(spec, Mapping):
        raise PartitionError("a pilot spec is a mapping")
    unknown = set(spec) - set(KEYS)
    if unknown:
        raise PartitionError(f"unknown key(s) in the pilot spec: {', '.join(sorted(unknown))} "
                             f"(accepted: {', '.join(KEYS)})")
    if scheduler not in SCHEDULERS:
        raise PartitionError(f"scheduler {scheduler!r}: slurm or pbs")
    raw = spec.get("partitions")
    if not isinstance(raw, list) or not raw:
        raise PartitionError("partitions: a list of the pilot's initial partitions")
    descriptions = [Description.parse(d) for d in raw]
    agent_cores = int(spec.get("agent_cores") or 0)
    nodes = spec.get("nodes")
    if nodes is None:
        nodes = pilot_nodes(descriptions, cores_per_node, agent_cores)
    elif not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise PartitionError(f"nodes: expected a whole number >= 1, got {nodes!r}")
    allocation = [Node(f"node{i}", cores_per_node) for i in range(nodes)]
    held = []
    for d in descriptions:                            # they must fit what is asked for
        held.append(fit(d, allocation, held, agent_cores if d.cores else 0))
    own, other = ("sbatch_args", "qsub_args") if scheduler == "slurm" else ("qsub_args", "sbatch_args")
    if spec.get(other):
        raise PartitionError(f"{other}: not for {scheduler} (give {own})")
    extra = spec.get(own) or []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise PartitionError(f"{own}: a list of strings")
    minutes = spec.get("time")
    if minutes is not None:
        if isinstance(minutes, str) and minutes.strip().isdigit():
            minutes = int(minutes)
        if not isinstance(minutes, int) or isinstance(minutes, bool) or minutes < 1:
            raise PartitionError(f"time: minutes, a whole number >= 1, got {spec.get('time')!r}")
    if scheduler == "slurm":
        args = [f"--nodes={nodes}", "--exclusive", "--job-name=tether-pilot"]
        if spec.get("partition"):
            args.append(f"--partition={spec['partition']}")
        if minutes is not None:
            args.append(f"--time={minutes}")
    else:
        args = ["-N", "tether-pilot", "-l", f"select={nodes}:ncpus={cores_per_node}", "-l", "place=scatter:excl"]
        if spec.get("partition"):
            args += ["-q", str(spec["partition"])]
        if minutes is not None:
            args += ["-l", f"walltime={minutes // 60:02d}:{minutes % 60:02d}:00"]
    texts = [d.text() if d.config == "default" and not d.command else None for d in descriptions]
    if any(t is None for t in texts):
        raise PartitionError("initial partitions with a config or command of their own: create them from "
                             "the script (tether partition create, or tether.pilot) instead")
    script = spec.get("script") or "tether partition wait ALL --state DONE >/dev/null\n"
    here = os.path.dirname(sys.executable)            # where this tether's command is
    lines = ["#!/bin/sh", "# a tether pilot: its initial partitions, then the script; when the script ends (or",
             "# exits), the partitions still running are stopped before the allocation ends",
             f"export PATH={shlex.quote(here)}:\"$PATH\"",
             *(["cd \"${PBS_O_WORKDIR:-.}\""] if scheduler == "pbs" else []),      # qsub starts in $HOME
             "tether_pilot_end() {", "  tether_rc=$?",
             f"  tether partition stop ALL --reason {shlex.quote(SCRIPT_ENDED)} >/dev/null",
             "  exit $tether_rc", "}", "trap tether_pilot_end EXIT",
             f"tether partition create {' '.join(shlex.quote(t) for t in texts)} --wait || exit 1",
             str(script).rstrip("\n"), ""]
    return [*args, *extra], "\n".join(lines)


def cores_per_node(partition: str | None, scheduler: str = "slurm") -> int:
    """The cores of the nodes a pilot runs on (the smallest): sinfo for a Slurm partition's,
    ``pbsnodes -a -F json`` (``resources_available.ncpus``, read by tether's one PBS client) on PBS."""
    if scheduler == "pbs":
        from ..pbs_hooks.commands import PBSCommandError, node_status

        try:
            nodes = node_status()
        except PBSCommandError as exc:
            raise PartitionError(f"cannot read the nodes' cores from pbsnodes: {exc}") from None
        try:
            counts = [int(n.available["ncpus"]) for n in nodes.values()]
        except (ValueError, KeyError, TypeError):
            counts = []
        if not counts:
            raise PartitionError("cannot read the nodes' cores from pbsnodes: no nodes")
        return min(counts)
    argv = ["sinfo", "-h", "-o", "%c"] + (["-p", partition] if partition else [])
    out = _run(argv, timeout=30)
    counts = [int(w.rstrip("+")) for w in out.stdout.split() if w.rstrip("+").isdigit()]
    if out.returncode != 0 or not counts:
        raise PartitionError(f"cannot read the nodes' cores from sinfo: {out.stderr.strip() or 'no nodes'}")
    return min(counts)


def _run(argv: list[str], timeout: float, script: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` through tether's one subprocess entry point, in this process's session; a
    PartitionError when it cannot run or times out."""
    try:
        return run_command(argv, input=script, timeout=timeout, check=False, new_session=False)
    except CommandError as exc:
        raise PartitionError(f"{argv[0]}: {exc.reason}") from None


def submit_pilot(spec: Mapping[str, Any], scheduler: str = "slurm") -> str:
    """Submit the pilot job as yourself (sbatch, or qsub on PBS); returns its job id."""
    if not isinstance(spec, Mapping):
        raise PartitionError("a pilot spec is a mapping")
    per_node = spec.get("cores_per_node") or cores_per_node(spec.get("partition"), scheduler)
    args, script = pilot_job(spec, int(per_node), scheduler)
    command = ["sbatch", "--parsable", *args] if scheduler == "slurm" else ["qsub", *args]
    out = _run(command, timeout=60, script=script)
    if out.returncode != 0:
        raise PartitionError(f"{command[0]}: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]

"""A pilot's resources and how partitions divide them (docs/requirements.md, "Pilot partitions").

The allocation is a list of nodes, each with its cores and GPUs (Slurm's own numbers for the
job: ``scontrol -d show job``). A partition holds a **slice**: some cores and GPUs on some
nodes, never shared with another partition that still holds its slice (STARTING or ACTIVE).

What a description may ask for:

* ``nodes: N`` -- N whole nodes that no partition uses;
* ``cores: C`` (with ``gpus: G``) -- C cores (G GPUs) packed onto the fewest nodes, partly used
  nodes first;
* ``size: "P%"`` -- P% of the allocation: that share of its nodes as whole nodes (rounded down),
  or, when that is no whole node (a one-node allocation), that share of its cores;
* ``size: FILL`` -- everything no other partition holds.

The agent's own needs (its config's ``cores``/``gpus``) are added to ``cores``/``gpus`` requests,
and taken out of what ``nodes``, a percentage and ``FILL`` give (abstract sizes hide them, as the
requirements ask).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

FILL = "FILL"


class PartitionError(Exception):
    """A partition request that cannot be met (its message says what is over-used)."""


@dataclass(frozen=True)
class Node:
    name: str
    cores: int
    gpus: int = 0


@dataclass
class Slice:
    """What one partition holds: node name -> [cores, gpus], in the allocation's node order."""

    parts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return list(self.parts)

    @property
    def cores(self) -> int:
        return sum(c for c, _ in self.parts.values())

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.parts.values())

    def to_data(self) -> dict[str, list[int]]:
        return {n: list(v) for n, v in self.parts.items()}

    @classmethod
    def from_data(cls, data: Mapping[str, Iterable[int]]) -> "Slice":
        return cls({str(n): [int(x) for x in v] for n, v in data.items()})


@dataclass(frozen=True)
class Description:
    """A partition description: one of nodes/cores/size, plus the agent config it runs."""

    nodes: int | None = None
    cores: int | None = None
    gpus: int = 0
    size: str | None = None            # "50%" or FILL
    config: str = "default"
    command: tuple[str, ...] | None = None   # an agent command instead of the config's

    def __post_init__(self) -> None:
        asked = [k for k in ("nodes", "cores", "size") if getattr(self, k) is not None]
        if len(asked) != 1:
            raise PartitionError("a partition description gives exactly one of nodes, cores or size "
                                 f"(got {', '.join(asked) or 'none'})")
        for key in ("nodes", "cores"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise PartitionError(f"{key}: expected a whole number >= 1, got {value!r}")
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or self.gpus < 0:
            raise PartitionError(f"gpus: expected a whole number >= 0, got {self.gpus!r}")
        if self.size is not None and self.size != FILL and not re.fullmatch(r"(100|[1-9][0-9]?)%", self.size):
            raise PartitionError(f"size: expected 1% to 100% or FILL, got {self.size!r}")
        if self.gpus and self.cores is None:
            raise PartitionError("gpus go with cores (nodes, a percentage and FILL include the nodes' GPUs)")

    @classmethod
    def parse(cls, value: "str | Mapping | Description") -> "Description":
        """From a mapping (the YAML/JSON form), a Description, or the short text forms
        ``2 nodes``/``1 node``, ``16 cores``, ``50%``, ``FILL``."""
        if isinstance(value, Description):
            return value
        if isinstance(value, str):
            text = value.strip()
            m = re.fullmatch(r"(\d+)\s*(nodes?|cores?)", text)
            if m:
                key = "nodes" if m.group(2).startswith("node") else "cores"
                return cls(**{key: int(m.group(1))})
            if text.upper() == FILL:
                return cls(size=FILL)
            return cls(size=text)
        if not isinstance(value, Mapping):
            raise PartitionError(f"a partition description is a mapping or text, got {type(value).__name__}")
        unknown = set(value) - {"nodes", "cores", "gpus", "size", "config", "command"}
        if unknown:
            raise PartitionError(f"unknown key(s) in a partition description: {', '.join(sorted(unknown))} "
                                 f"(accepted: nodes, cores, gpus, size, config, command)")
        size = value.get("size")
        command = value.get("command")
        if command is not None and (not isinstance(command, list) or not command
                                    or not all(isinstance(a, str) for a in command)):
            raise PartitionError("command: expected a list of strings (the agent's argv)")
        return cls(nodes=value.get("nodes"), cores=value.get("cores"), gpus=value.get("gpus") or 0,
                   size=(FILL if str(size).upper() == FILL else str(size)) if size is not None else None,
                   config=str(value.get("config") or "default"),
                   command=tuple(command) if command else None)

    def to_data(self) -> dict:
        data = {k: getattr(self, k) for k in ("nodes", "cores", "size") if getattr(self, k) is not None}
        if self.gpus:
            data["gpus"] = self.gpus
        data["config"] = self.config
        if self.command:
            data["command"] = list(self.command)
        return data

    def text(self) -> str:
        if self.nodes is not None:
            return f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        if self.cores is not None:
            return f"{self.cores} cores" + (f" + {self.gpus} GPUs" if self.gpus else "")
        return str(self.size)


def free_resources(nodes: list[Node], held: Iterable[Slice]) -> dict[str, list[int]]:
    """node -> [free cores, free GPUs] given the slices partitions hold."""
    free = {n.name: [n.cores, n.gpus] for n in nodes}
    for s in held:
        for name, (cores, gpus) in s.parts.items():
            if name in free:
                free[name][0] -= cores
                free[name][1] -= gpus
    return free


def _describe_free(nodes: list[Node], free: dict[str, list[int]]) -> str:
    whole = sum(1 for n in nodes if free[n.name] == [n.cores, n.gpus])
    cores = sum(max(c, 0) for c, _ in free.values())
    gpus = sum(max(g, 0) for _, g in free.values())
    total_cores = sum(n.cores for n in nodes)
    total_gpus = sum(n.gpus for n in nodes)
    text = f"{whole} of {len(nodes)} nodes free, {cores} of {total_cores} cores"
    return text + (f", {gpus} of {total_gpus} GPUs" if total_gpus else "")


def fit(desc: Description, nodes: list[Node], held: Iterable[Slice], agent_cores: int = 0,
        agent_gpus: int = 0) -> Slice:
    """The slice ``desc`` gets, next to the slices in ``held``; PartitionError when it does not
    fit (naming what is over-used and what is free)."""
    free = free_resources(nodes, held)
    whole = [n for n in nodes if free[n.name] == [n.cores, n.gpus]]
    want_nodes: int | None = desc.nodes
    if desc.size is not None and desc.size != FILL:
        share = int(desc.size[:-1])
        want_nodes = math.floor(len(nodes) * share / 100) or None
        if want_nodes is None:                           # a share of the cores (one-node pilot)
            cores = max(1, math.floor(sum(n.cores for n in nodes) * share / 100))
            return _fit_cores(desc, nodes, free, cores, 0, agent_cores, agent_gpus, what=desc.size)
    if want_nodes is not None:
        if len(whole) < want_nodes:
            raise PartitionError(f"{desc.text() if desc.nodes else desc.size} needs {want_nodes} whole "
                                 f"node{'s' if want_nodes != 1 else ''}: over-used -- "
                                 f"{_describe_free(nodes, free)}")
        picked = whole[:want_nodes]
        result = Slice({n.name: [n.cores, n.gpus] for n in picked})
        _check_agent(result, agent_cores, agent_gpus, desc)
        return result
    if desc.size == FILL:
        result = Slice({n.name: list(free[n.name]) for n in nodes if free[n.name][0] > 0})
        if not result.parts:
            raise PartitionError(f"FILL: over-used -- nothing is free ({_describe_free(nodes, free)})")
        _check_agent(result, agent_cores, agent_gpus, desc)
        return result
    assert desc.cores is not None
    return _fit_cores(desc, nodes, free, desc.cores + agent_cores, desc.gpus + agent_gpus, 0, 0,
                      what=desc.text())


def _fit_cores(desc: Description, nodes: list[Node], free: dict[str, list[int]], cores: int, gpus: int,
               agent_cores: int, agent_gpus: int, *, what: str) -> Slice:
    """Pack ``cores`` (and ``gpus``) onto the fewest nodes: partly used nodes first, then whole
    ones, each in the allocation's order."""
    order = sorted(nodes, key=lambda n: (free[n.name] == [n.cores, n.gpus], nodes.index(n)))
    result = Slice()
    need_c, need_g = cores, gpus
    for n in order:
        if need_c <= 0 and need_g <= 0:
            break
        fc, fg = free[n.name]
        if fc <= 0:
            continue
        take_c, take_g = min(fc, max(need_c, 0)), min(fg, max(need_g, 0))
        if take_c <= 0 and take_g <= 0:
            continue
        take_c = max(take_c, 1)                          # a node in a slice has a core for its agent
        result.parts[n.name] = [take_c, take_g]
        need_c -= take_c
        need_g -= take_g
    if need_c > 0 or need_g > 0:
        over = "cores" if need_c > 0 else "GPUs"
        raise PartitionError(f"{what} needs {cores} cores" + (f" and {gpus} GPUs" if gpus else "")
                             + f": {over} over-used -- {_describe_free(nodes, free)}")
    _check_agent(result, agent_cores, agent_gpus, desc)
    return result


def _check_agent(result: Slice, agent_cores: int, agent_gpus: int, desc: Description) -> None:
    if result.cores <= agent_cores or result.gpus < agent_gpus:
        raise PartitionError(f"{desc.text()}: its {result.cores} cores leave nothing beside the agent's own "
                             f"{agent_cores} cores" + (f" and {agent_gpus} GPUs" if agent_gpus else ""))


def unused(nodes: list[Node], held: Iterable[Slice]) -> str | None:
    """A warning when the partitions leave part of the allocation unused (under-use, in the
    requirements' words), else None."""
    free = free_resources(nodes, held)
    cores = sum(max(c, 0) for c, _ in free.values())
    if cores <= 0:
        return None
    return f"under-used: {_describe_free(nodes, free)} that no partition uses"


def parse_cpus_per_node(text: str) -> list[int]:
    """Slurm's compressed counts (``SLURM_JOB_CPUS_PER_NODE``): ``8(x2),4`` -> [8, 8, 4]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise PartitionError(f"cannot read the allocation's CPUs per node from {text!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out

"""How many nodes each partition has, read from slurm.conf, for the job_submit plugin's note at
submit: a job tether planned on more nodes than its partition has waits with Reason
PartitionNodeLimit forever (Slurm says nothing at submit, for ``-N4`` either), so the user is told.

slurmctld's own partition records are not reachable from a plugin (their layout changes with each
release and their RPC would need the locks slurmctld holds during job_submit), so the file is read:
its ``PartitionName`` lines (``DEFAULT`` lines' values carried on), their ``Nodes=`` hostlists,
``ALL`` as every ``NodeName``, ``NodeSet`` names by their ``Nodes=``, and ``Include`` files. A
partition whose nodes cannot be counted this way (a feature-based NodeSet, dynamic nodes) is left
out: no note rather than a wrong one.
"""

from __future__ import annotations

import glob
import os
import shlex

from ..hooks.hostlist import expand_hostlist

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
_MAX_INCLUDE_DEPTH = 8


def slurm_conf_path(env: dict[str, str] | None = None) -> str:
    """The slurm.conf slurmctld reads: $SLURM_CONF, else the built-in default."""
    return (env if env is not None else os.environ).get("SLURM_CONF") or DEFAULT_SLURM_CONF


def _lines(path: str, depth: int = 0) -> list[list[tuple[str, str]]]:
    """slurm.conf's settings, one list of (key lowercased, value) per line, ``Include`` files in
    place (relative to slurm.conf's directory, globs as Slurm takes them); comments dropped,
    backslash-continued lines joined."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    out = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split(None, 1)
        if words[0].lower() == "include" and len(words) == 2:
            if depth < _MAX_INCLUDE_DEPTH:
                pattern = words[1].strip()
                pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
                for name in sorted(glob.glob(pattern)):
                    out += _lines(name, depth + 1)
            continue
        try:
            items = shlex.split(line)
        except ValueError:
            continue
        pairs = [tuple(item.split("=", 1)) for item in items if "=" in item]
        if pairs:
            out.append([(k.strip().lower(), v) for k, v in pairs])
    return out


def partition_sizes(path: str) -> tuple[dict[str, int], str | None]:
    """({partition: node count}, the default partition's name or None) as slurm.conf says."""
    lines = _lines(path)
    nodes: list[str] = []
    nodesets: dict[str, list[str] | None] = {}
    for line in lines:
        key, value = line[0]
        if key == "nodename" and value.lower() != "default":
            try:
                nodes += expand_hostlist(value)
            except ValueError:
                continue
        elif key == "nodeset":
            given = dict(line[1:]).get("nodes")
            try:
                nodesets[value] = expand_hostlist(given) if given else None    # Feature=: not known here
            except ValueError:
                nodesets[value] = None
    sizes: dict[str, int] = {}
    default_values: dict[str, str] = {}
    default = None
    for line in lines:
        key, name = line[0]
        if key != "partitionname":
            continue
        values = {**default_values, **dict(line[1:])}
        if name.lower() == "default":
            default_values = values
            continue
        if values.get("default", "").lower() == "yes":
            default = name
        # no Nodes= (dynamic nodes join later): not known from the file
        count = _count(values["nodes"], nodes, nodesets) if values.get("nodes") else None
        if count is not None:
            sizes[name] = count
    return sizes, default


def _count(spec: str, nodes: list[str], nodesets: dict[str, list[str] | None]) -> int | None:
    """How many distinct nodes a partition's ``Nodes=`` names (None: not known from the file)."""
    found: set[str] = set()
    if spec.upper() == "ALL":
        return len(set(nodes))
    try:
        names = expand_hostlist(spec)
    except ValueError:
        return None
    for name in names:
        if name in nodesets:
            if nodesets[name] is None:
                return None
            found.update(nodesets[name])
        else:
            found.add(name)
    return len(found)


def partition_table(path: str) -> str:
    """What the C shim keeps (bridge.h, tether_partitions_loaded): the default partition's name on
    the first line (empty when none), then ``NAME COUNT`` per partition."""
    sizes, default = partition_sizes(path)
    return "".join([f"{default or ''}\n", *(f"{name} {count}\n" for name, count in sizes.items()
                                           if name and " " not in name and "\n" not in name)])

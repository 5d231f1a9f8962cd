"""Option policy: what tether controls and what users (and admins) may add.

docs/requirements.md, "Common Slurm options" / "Common PBS options": the options tether generates
cannot be given by the user; other options pass through as long as they do not conflict. For PBS, a
user ``-l select`` keeps its other chunk resources (appended to each of tether's chunks) while
chunk count, arrangement and the GPU/CPU count per chunk are tether's.

Everything here is pure: argument lists in, parsed options or a ``RequestError`` out. The lists are
literal tables so a reader can hold them against docs/requirements.md.
"""

from __future__ import annotations

import re

from .errors import RequestError
from .records import dataclass
from .surface import SLOT_OPTIONS

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Iterable, Sequence

# --------------------------------------------------------------------------------------------
# sbatch's option vocabulary (Slurm 22.05.8, read off `sbatch --<letter>` on this machine).
# R: requires an argument, O: optional argument (only as --opt=value), N: no argument.
# getopt_long accepts unambiguous prefixes, so a user's "--ntasks-per-n=2" is --ntasks-per-node.
# --------------------------------------------------------------------------------------------
SBATCH_LONG_OPTIONS: dict[str, str] = {
    "account": "R", "acctg-freq": "R", "array": "R", "batch": "R", "bb": "R", "bbf": "R",
    "begin": "R", "chdir": "R", "cluster": "R", "cluster-constraint": "R", "clusters": "R",
    "comment": "R", "constraint": "R", "container": "R", "context": "R", "contiguous": "N",
    "core-spec": "R", "cores-per-socket": "R", "cpu-freq": "R", "cpus-per-gpu": "R",
    "cpus-per-task": "R", "deadline": "R", "delay-boot": "R", "dependency": "R",
    "distribution": "R", "error": "R", "exclude": "R", "exclusive": "O", "export": "R",
    "export-file": "R", "extra-node-info": "R", "get-user-env": "O", "gid": "R", "gpu-bind": "R",
    "gpu-freq": "R", "gpus": "R", "gpus-per-node": "R", "gpus-per-socket": "R",
    "gpus-per-task": "R", "gres": "R", "gres-flags": "R", "help": "N", "hint": "R", "hold": "N",
    "ignore-pbs": "N", "input": "R", "job-name": "R", "kill-on-invalid-dep": "R", "licenses": "R",
    "mail-type": "R", "mail-user": "R", "mcs-label": "R", "mem": "R", "mem-bind": "R",
    "mem-per-cpu": "R", "mem-per-gpu": "R", "mincpus": "R", "network": "R", "nice": "O",
    "no-kill": "O", "no-requeue": "N", "nodefile": "R", "nodelist": "R", "nodes": "R",
    "ntasks": "R", "ntasks-per-core": "R", "ntasks-per-gpu": "R", "ntasks-per-node": "R",
    "ntasks-per-socket": "R", "ntasks-per-tres": "R", "open-mode": "R", "output": "R",
    "overcommit": "N", "oversubscribe": "N", "parsable": "N", "partition": "R", "power": "R",
    "prefer": "R", "priority": "R", "profile": "R", "propagate": "O", "qos": "R", "quiet": "N",
    "reboot": "N", "requeue": "N", "reservation": "R", "signal": "R", "sockets-per-node": "R",
    "spread-job": "N", "switches": "R", "tasks-per-node": "R", "test-only": "N",
    "thread-spec": "R", "threads-per-core": "R", "time": "R", "time-min": "R", "tmp": "R",
    "uid": "R", "usage": "N", "use-min-nodes": "N", "verbose": "N", "version": "N", "wait": "N",
    "wait-all-nodes": "R", "wckey": "R", "wrap": "R",
}

SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "h": "help",
    "H": "hold", "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution",
    "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit",
    "p": "partition", "q": "qos", "Q": "quiet", "s": "oversubscribe", "S": "core-spec",
    "t": "time", "v": "verbose", "V": "version", "w": "nodelist", "W": "wait", "x": "exclude",
}

# tether's own options (hooks/surface.py): in a job spec they are keys, not sbatch arguments.
_SPEC_KEYS = {opt.name: opt.spec_name("slurm") for opt in SLOT_OPTIONS}

# --------------------------------------------------------------------------------------------
# Slurm: options tether controls for a job with a tether request.
# --------------------------------------------------------------------------------------------
# Node and task layout: one container (one task) per node, as the resource tables say.
SLURM_LAYOUT_OPTIONS = ("--nodes", "--ntasks", "--ntasks-per-node", "--tasks-per-node",
                        "--ntasks-per-gpu", "--ntasks-per-tres")
# GPU requests: tether computes them from slots; a user --gres that references a GPU is rejected.
SLURM_GPU_OPTIONS = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket")
# How each field of a Slurm plan is spelled as an sbatch option (tether.hooks.plan.SlurmResources).
SLURM_FIELD_OPTIONS = {"min_nodes": "--nodes", "max_nodes": "--nodes", "ntasks": "--ntasks",
                       "tasks_per_node": "--tasks-per-node", "cpus_per_task": "--cpus-per-task",
                       "gpus": "--gpus", "gpus_per_task": "--gpus-per-task", "gpus_per_node": "--gres"}
# Generated only into tether's own batch scripts (docs/requirements.md, "Common Slurm options").
SLURM_SCRIPT_OPTIONS = ("--job-name", "--partition", "--wckey", "--no-requeue", "--requeue",
                        "--output", "--error")

# --------------------------------------------------------------------------------------------
# PBS (OpenPBS qsub). R: takes an argument, N: no argument.
# --------------------------------------------------------------------------------------------
QSUB_OPTIONS: dict[str, str] = {
    "a": "R", "A": "R", "c": "R", "C": "R", "e": "R", "f": "N", "h": "N", "I": "N", "j": "R",
    "J": "R", "k": "R", "l": "R", "m": "R", "M": "R", "N": "R", "o": "R", "p": "R", "P": "R",
    "q": "R", "r": "R", "R": "R", "S": "R", "u": "R", "v": "R", "V": "N", "W": "R", "X": "N",
    "z": "N",
}
# Generated into tether's PBS batch scripts (docs/requirements.md, "Common PBS options"); -W only
# for umask.
PBS_SCRIPT_OPTIONS = ("-N", "-q", "-e", "-o", "-V", "-r", "-P")
PBS_SCRIPT_W_ATTRIBUTES = ("umask",)
# Job-wide -l resources that would contradict tether's select.
PBS_JOBWIDE_FORBIDDEN = ("nodes", "nodect", "ncpus", "ngpus")
# place=arrangement[:sharing][:group=res]; the arrangement is tether's (scatter: one chunk per host).
PBS_ARRANGEMENTS = ("free", "pack", "scatter", "vscatter")


@dataclass(frozen=True)
class Arg:
    """One parsed scheduler option. ``name`` is canonical: ``--long`` for sbatch, ``-x`` for qsub."""

    name: str
    value: str | None
    given: str  # what the user wrote, for messages

    def __str__(self) -> str:
        return self.given


# --------------------------------------------------------------------------------------------
# sbatch argument parsing
# --------------------------------------------------------------------------------------------
def resolve_sbatch_long(word: str, given: str) -> str:
    """Resolve a long option name (without dashes) as getopt_long does: exact, else unique prefix."""
    if word in SBATCH_LONG_OPTIONS:
        return word
    if word in _SPEC_KEYS:
        raise RequestError(f"{given}: --{word} is tether's own option; set {_SPEC_KEYS[word]} "
                           f"in the job spec instead of passing it as an sbatch argument")
    matches = sorted(o for o in SBATCH_LONG_OPTIONS if o.startswith(word))
    if len(matches) == 1 and word:
        return matches[0]
    if matches and word:
        raise RequestError(f"{given}: --{word} is ambiguous (could be "
                           + ", ".join("--" + m for m in matches) + "); spell the option out")
    raise RequestError(f"{given}: --{word} is not an sbatch option (Slurm 22.05); see `sbatch --help`")


def parse_sbatch_args(args: Sequence[str]) -> list[Arg]:
    """Parse sbatch arguments the way Determined's ``slurm.sbatch_args`` holds them.

    Each element is normally one option (``--mem=10G``, ``--time 10``, ``-N2``); an option that
    requires a value may also take it from the next element (``["--time", "10"]``).
    """
    out: list[Arg] = []
    items = _checked_items(args, "sbatch argument")
    i = 0
    while i < len(items):
        element = items[i]
        i += 1
        text = element.lstrip()
        if text.startswith("--") and len(text) > 2:
            head, sep, rest = _split_value(text[2:])
            name = resolve_sbatch_long(head, element)
            kind = SBATCH_LONG_OPTIONS[name]
            if kind == "N" and sep:
                raise RequestError(f"{element}: --{name} takes no value")
            if kind == "O" and sep == " ":
                raise RequestError(f"{element}: write --{name}=VALUE (the value is optional, "
                                   f"so it must be attached with '=')")
            value: str | None = rest if sep else None
            if kind == "R" and not sep:
                if i >= len(items):
                    raise RequestError(f"{element}: --{name} requires a value")
                value = items[i]
                i += 1
            out.append(Arg("--" + name, value, element))
        elif text.startswith("-") and len(text) > 1 and not text.startswith("--"):
            parsed, used_next = _parse_short_cluster(text[1:], element, items[i] if i < len(items) else None)
            out.extend(parsed)
            i += used_next
        else:
            raise RequestError(f"sbatch argument {element!r} is not an option (expected --name=value)")
    return out


def _parse_short_cluster(body: str, element: str, nxt: str | None) -> tuple[list[Arg], int]:
    """Parse ``-N2``, ``-N 2``, ``-Hv`` (getopt clusters); a value may come from the next element.

    Returns the options and how many following elements were consumed (0 or 1).
    """
    out = []
    for j, letter in enumerate(body):
        if letter not in SBATCH_SHORT_OPTIONS:
            raise RequestError(f"{element}: -{letter} is not an sbatch option (Slurm 22.05)")
        name = SBATCH_SHORT_OPTIONS[letter]
        if SBATCH_LONG_OPTIONS[name] != "R":
            out.append(Arg("--" + name, None, element))
            continue
        value = body[j + 1:].strip()
        if value:
            out.append(Arg("--" + name, value, element))
            return out, 0
        if nxt is None:
            raise RequestError(f"{element}: -{letter} requires a value")
        out.append(Arg("--" + name, nxt, element))
        return out, 1
    return out, 0


def _split_value(text: str) -> tuple[str, str, str]:
    """Split ``name=value`` / ``name value`` / ``name``; returns (name, separator, value)."""
    m = re.match(r"([^=\s]*)(?:(=)|\s+)?(.*)\Z", text, re.S)
    assert m is not None
    name, eq, rest = m.group(1), m.group(2), m.group(3)
    if eq:
        return name, "=", rest
    if rest:
        return name, " ", rest.strip()
    return name, "", ""


def _checked_items(args: Sequence[object], what: str) -> list[str]:
    """The arguments as a list, each a string without control characters (else a RequestError)."""
    items = list(args)
    for item in items:
        if not isinstance(item, str):
            raise RequestError(f"{what} {item!r} is not a string")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in item):
            raise RequestError(f"{what} {item!r} contains a control character (newline, tab, ...); "
                               f"remove it")
    return items


def strip_gres_prefix(item: str) -> str:
    """``gres:gpu:2`` (Slurm 22.05) / ``gres/gpu:2`` (24.11) -> ``gpu:2``; other items unchanged."""
    for prefix in ("gres:", "gres/"):
        if item.startswith(prefix):
            return item[len(prefix):]
    return item


def gres_references_gpu(value: str) -> bool:
    """True if a --gres / TRES value names a GPU (``gpu``, ``gpu:2``, ``gres:gpu:a100:1``, ``gres/gpu``)."""
    return any(strip_gres_prefix(item.strip().lower()).split(":", 1)[0] == "gpu"
               for item in value.split(","))


SPEC_HINT = "use slots_per_trial, slots_per_node, slot_type, gpu_type or resource_pool instead"


def check_slurm_args(args: Sequence[Arg], generated: Iterable[str], *, script: bool,
                     source: str, hint: str = SPEC_HINT) -> list[Arg]:
    """Apply the Slurm option policy; return the arguments that pass through.

    ``generated`` names the options tether's plan emits (they are controlled even when not in the
    fixed lists, e.g. ``--cpus-per-task`` for CPU slots). ``script`` is True for tether's own batch
    scripts, where ``--job-name``/``--partition``/... are tether's too. ``source`` names where the
    arguments came from for the message (``slurm.sbatch_args``, a partition override, ...).
    """
    controlled = set(SLURM_LAYOUT_OPTIONS) | set(SLURM_GPU_OPTIONS) | set(generated)
    where = f"{source}: " if source else ""
    if script:
        controlled |= set(SLURM_SCRIPT_OPTIONS)
    passed: list[Arg] = []
    for arg in args:
        if arg.name == "--gres":
            if arg.value is not None and gres_references_gpu(arg.value):
                raise RequestError(f"{where}{arg} requests GPUs; tether computes GPU requests from "
                                   f"slots, so remove it (a --gres without GPUs, e.g. --gres=nic:1, "
                                   f"is allowed)")
            passed.append(arg)
            continue
        if arg.name in controlled:
            raise RequestError(f"{where}{arg} conflicts with {arg.name}, which tether sets from the "
                               f"slot request; remove it ({hint})")
        passed.append(arg)
    return passed


# --------------------------------------------------------------------------------------------
# qsub argument parsing and the select merge
# --------------------------------------------------------------------------------------------
def parse_qsub_args(args: Sequence[str]) -> list[Arg]:
    """Parse qsub arguments (``-l mem=10gb``, ``-lwalltime=1:00:00``, ``["-q", "gpu"]``, ``-V``)."""
    out: list[Arg] = []
    items = _checked_items(args, "qsub argument")
    i = 0
    while i < len(items):
        element = items[i]
        i += 1
        text = element.strip()
        if not (text.startswith("-") and len(text) > 1) or text.startswith("--"):
            raise RequestError(f"qsub argument {element!r} is not a qsub option (expected -x value)")
        letter, rest = text[1], text[2:].strip()
        if letter not in QSUB_OPTIONS:
            raise RequestError(f"{element}: -{letter} is not a qsub option (OpenPBS)")
        if QSUB_OPTIONS[letter] == "N":
            if rest:
                raise RequestError(f"{element}: -{letter} takes no value")
            out.append(Arg("-" + letter, None, element))
            continue
        if not rest:
            if i >= len(items):
                raise RequestError(f"{element}: -{letter} requires a value")
            rest = items[i].strip()
            i += 1
        out.append(Arg("-" + letter, rest, element))
    return out


def split_resource_list(value: str) -> list[tuple[str, str]]:
    """Split a ``-l`` value ``a=1,b=2`` into pairs (select's own ``:``/``+`` stay inside values)."""
    pairs = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, val = part.partition("=")
        if not eq or not name or not val:
            raise RequestError(f"-l {value}: {part!r} is not resource=value")
        pairs.append((name.strip(), val.strip()))
    return pairs


_CHUNK_RE = re.compile(r"(?:([0-9]+):)?(.*)\Z", re.S)


def parse_select(value: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """Parse a PBS select statement ``2:ncpus=4:mem=2gb+1:ngpus=1`` into (count, resources) chunks."""
    chunks = []
    for spec in value.split("+"):
        spec = spec.strip()
        m = re.fullmatch(r"([0-9]+)", spec)
        if m:
            chunks.append((int(m.group(1)), []))
            continue
        m = _CHUNK_RE.fullmatch(spec)
        assert m is not None
        count = int(m.group(1)) if m.group(1) else 1
        resources = []
        for item in m.group(2).split(":"):
            name, eq, val = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not val:
                raise RequestError(f"-l select={value}: {item!r} is not resource=value")
            resources.append((name, val))
        chunks.append((count, resources))
    return chunks


@dataclass(frozen=True)
class PbsUserRequest:
    """What a user asked PBS for besides tether's slots, split out of qsub arguments
    (``split_qsub_args``) or read from a job's ``Resource_List`` (the PBS submit hook)."""

    selects: tuple[str, ...] = ()                  # each ``-l select=...``, in order
    places: tuple[str, ...] = ()                   # each ``-l place=...``
    jobwide: tuple[tuple[str, str], ...] = ()      # ``-l nodes|nodect|ncpus|ngpus=...`` (refused)
    args: tuple[Arg, ...] = ()                     # everything else, passed through as given


def split_qsub_args(args: Sequence[Arg]) -> PbsUserRequest:
    """Split parsed qsub arguments into the resources tether's select owns and the rest (other
    ``-l`` resources stay together as the user grouped them)."""
    selects: list[str] = []
    places: list[str] = []
    jobwide: list[tuple[str, str]] = []
    rest: list[Arg] = []
    for arg in args:
        if arg.name != "-l":
            rest.append(arg)
            continue
        other = []
        for name, val in split_resource_list(arg.value or ""):
            if name == "select":
                selects.append(val)
            elif name == "place":
                places.append(val)
            elif name in PBS_JOBWIDE_FORBIDDEN:
                jobwide.append((name, val))
            else:
                other.append(f"{name}={val}")
        if other:
            rest.append(Arg("-l", ",".join(other), arg.given))
    return PbsUserRequest(tuple(selects), tuple(places), tuple(jobwide), tuple(rest))


@dataclass(frozen=True)
class PbsMerge:
    """A user's PBS request after tether's policy: what is added to each of tether's chunks, the
    sharing/grouping parts of ``place``, the arguments that pass through, and what was replaced."""

    chunk_resources: tuple[tuple[str, str], ...] = ()
    place_extra: tuple[str, ...] = ()
    args: tuple[Arg, ...] = ()
    notices: tuple[str, ...] = ()

    def then(self, later: "PbsMerge") -> "PbsMerge":
        """This merge followed by a later source's (its values win)."""
        return PbsMerge(tuple({**dict(self.chunk_resources), **dict(later.chunk_resources)}.items()),
                        tuple(dict.fromkeys(self.place_extra + later.place_extra)),
                        self.args + later.args, self.notices + later.notices)


def merge_pbs_request(user: PbsUserRequest, *, chunks: int, controlled_chunk: Sequence[str],
                      tether_chunk: Sequence[tuple[str, str]], script: bool, source: str) -> PbsMerge:
    """Apply the PBS option policy to one source of user requests.

    ``controlled_chunk`` are the per-chunk resources tether owns for this slot type (``ngpus`` for
    GPU slots, ``ncpus`` for CPU slots); ``tether_chunk`` are the ones it sets, for the notice text.
    ``script``: the arguments go into tether's own batch script (its common options are refused).
    """
    for name, val in user.jobwide:
        raise RequestError(f"{source}: -l {name}={val} conflicts with the select statement tether "
                           f"computes from slots; remove it (give other chunk resources in "
                           f"-l select=..., e.g. -l select=1:mem=10gb)")
    chunk_resources: dict[str, str] = {}
    notices: list[str] = []
    for select in user.selects:
        _merge_select(select, chunks, controlled_chunk, dict(tether_chunk), chunk_resources, notices, source)
    place_extra: list[str] = []
    for place in user.places:
        place_extra.extend(_merge_place(place, notices, source))
    passed = [_check_script_arg(arg, source) for arg in user.args] if script else list(user.args)
    return PbsMerge(tuple(chunk_resources.items()), tuple(dict.fromkeys(place_extra)), tuple(passed),
                    tuple(notices))


def _check_script_arg(arg: Arg, source: str) -> Arg:
    """A qsub argument for tether's own batch script: its common options are tether's."""
    if arg.name in PBS_SCRIPT_OPTIONS:
        raise RequestError(f"{source}: {arg} conflicts with {arg.name}, which tether generates "
                           f"(job name, queue from resource_pool, logs, -V, -r n, project); remove it")
    if arg.name == "-W":
        for name, _ in split_resource_list(arg.value or ""):
            if name in PBS_SCRIPT_W_ATTRIBUTES:
                raise RequestError(f"{source}: {arg} conflicts with -W {name}=..., which tether sets "
                                   f"(umask=0022); remove it")
    return arg


def _merge_select(value: str, chunks: int, controlled: Sequence[str], set_values: dict[str, str],
                  out: dict[str, str], notices: list[str], source: str) -> None:
    parsed = parse_select(value)
    counts = sum(c for c, _ in parsed)
    if len(parsed) > 1:
        notices.append(f"{source}: -l select={value}: chunk arrangement is tether's; the chunks were "
                       f"combined into {chunks} identical chunk(s)")
    elif counts != chunks:
        notices.append(f"{source}: -l select={value}: chunk count {counts} replaced by {chunks} "
                       f"(slots_per_trial / slots_per_node)")
    statement: dict[str, str] = {}
    for _, resources in parsed:
        for name, val in resources:
            if name in controlled:
                if name in set_values:
                    if set_values[name] != val:
                        notices.append(f"{source}: -l select: {name}={val} replaced by "
                                       f"{name}={set_values[name]} (slots_per_node)")
                else:
                    notices.append(f"{source}: -l select: {name}={val} dropped; tether controls {name} "
                                   f"for this slot type")
                continue
            if name in statement and statement[name] != val:
                raise RequestError(f"{source}: -l select={value} gives {name} twice ({statement[name]} "
                                   f"and {val}); tether makes all chunks identical, so give one value")
            statement[name] = val
    out.update(statement)


def _merge_place(value: str, notices: list[str], source: str) -> list[str]:
    extra = []
    for part in value.split(":"):
        if part in PBS_ARRANGEMENTS:
            if part != "scatter":
                notices.append(f"{source}: -l place={value}: arrangement {part} replaced by scatter "
                               f"(one container per host)")
            continue
        if not part:
            continue
        extra.append(part)
    return extra

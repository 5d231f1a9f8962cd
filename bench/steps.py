"""What bench/step.py and bench/launch.py share: their arguments and an interleaved timing loop of
step launches, run inside one allocation, with its "kind microseconds" lines parsed back."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Mapping

ROOT = os.environ.get("TETHER_BENCH_SANDBOX_DIR", "/var/lib/tether/sandbox-bench")


def arguments(doc: str, rounds: int, groups: tuple[str, ...] = ()) -> argparse.Namespace:
    """The benchmarks' options; ``groups``: the kinds of figures a benchmark has, which ``--only``
    chooses from (all by default)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    if groups:
        parser.add_argument("--only", choices=groups, action="append",
                            help="only these figures (repeatable; default: all)")
    args = parser.parse_args()
    if groups and not args.only:
        args.only = list(groups)
    return args


def timing_loop(rounds: int, cases: Mapping[str, tuple[str, str]]) -> str:
    """A bash loop: ``rounds`` times, each kind in turn runs its setup (untimed) and times its
    command; prints "kind microseconds" per step. ``cases``: kind -> (setup, command). Rounds
    rotate the order of the kinds (round r starts with kind r mod n), as bench/submit.py rotates
    its modes: part of a step's cost lands on the step after it (its removal, its completion
    while the next one starts), and in a fixed order the same kind would always pay it."""
    functions, calls = [], []
    for n, (kind, (setup, command)) in enumerate(cases.items()):
        functions.append(f"kind{n}() {{\n  {setup or ':'}\n  t0=$(date +%s%N)\n  {command}\n"
                         f"  t1=$(date +%s%N)\n  echo \"{kind} $(( (t1 - t0) / 1000 ))\"\n}}")
    count = len(cases)
    for start in range(count):
        order = "; ".join(f"kind{(start + k) % count}" for k in range(count))
        calls.append(f"    {start}) {order} ;;")
    return ("\n".join(functions) + f"\nfor i in $(seq 0 {rounds - 1}); do\n  case $(( i % {count} )) in\n"
            + "\n".join(calls) + "\n  esac\ndone\n")


def step_times(out: str, kinds) -> dict[str, list[float]]:
    """Milliseconds per step, by kind, from the loop's output."""
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for line in out.splitlines():
        kind, _, usecs = line.partition(" ")
        if kind in times and usecs.isdigit():
            times[kind].append(int(usecs) / 1000)
    return times


def print_medians(title: str, times: Mapping[str, list[float]]) -> dict[str, float]:
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"{title} (median ms per step)")
    for kind, ms in median.items():
        print(f"  {kind:<7} {ms:7.1f} ms")
    return median

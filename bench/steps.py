"""What bench/step.py and bench/launch.py share: their arguments and an interleaved timing loop of
step launches, run inside one allocation, with its "kind microseconds" lines parsed back."""

from __future__ import annotations

import argparse
import statistics
from typing import Mapping

ROOT = "/var/lib/tether/sandbox-bench"


def arguments(doc: str, rounds: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    return parser.parse_args()


def timing_loop(rounds: int, cases: Mapping[str, tuple[str, str]]) -> str:
    """A bash loop: ``rounds`` times, for each kind in turn, run its setup (untimed) and time its
    command; prints "kind microseconds" per step. ``cases``: kind -> (setup, command)."""
    body = []
    for kind, (setup, command) in cases.items():
        body += [setup or ":", "t0=$(date +%s%N)", command, "t1=$(date +%s%N)",
                 f'echo "{kind} $(( (t1 - t0) / 1000 ))"']
    return f"for i in $(seq {rounds}); do\n  " + "\n  ".join(body) + "\ndone\n"


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

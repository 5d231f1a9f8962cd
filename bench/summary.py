"""The figures `make bench` puts into the README: each benchmark records its main ones here as it
prints them (one JSON line each, appended to the file ``$TETHER_BENCH_SUMMARY`` names; nothing when
it is unset), and ``bench/report.py`` writes the README's performance table from them."""

from __future__ import annotations

import json
import os
import statistics


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile)."""
    q1, mid, q3 = statistics.quantiles(sorted(values), n=4) if len(values) > 1 else (values[0],) * 3
    return q1, statistics.median(values), q3


def record(bench: str, figure: str, value: str, goal: str = "", met: bool | None = None) -> None:
    """One row of the README's table: what was measured (``value``, with its quartiles where it has
    them), against which goal, and whether this run met it."""
    path = os.environ.get("TETHER_BENCH_SUMMARY")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"bench": bench, "figure": figure, "value": value, "goal": goal, "met": met}) + "\n")

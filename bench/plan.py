#!/usr/bin/env python3
"""Benchmark: plan and render a 10,000-node request (goal: under 10 ms), against a 1-node baseline.

Prints, for each scheduler and table row, the best-of-N time of make_plan + script_directives for a
10,000-node request and for a 1-node request measured in the same run, and their ratio.
Run: /opt/tether/venv/bin/python bench/plan.py
"""

from __future__ import annotations

import timeit

from tether.hooks.config import validate_config
from tether.hooks.header import batch_header
from tether.hooks.plan import make_plan
from tether.hooks.policy import parse_qsub_args, parse_sbatch_args, split_qsub_args
from tether.hooks.render import script_directives
from tether.hooks.request import Request

from summary import record

GOAL_MS = 10.0
NODES = 10_000
CASES = [  # (label, scheduler, config, slot_type, slots per node)
    ("slurm gpu tres+gres", "slurm", {}, "cuda", 8),
    ("slurm gpu gres", "slurm", {"tres_supported": False}, "cuda", 8),
    ("slurm cpu", "slurm", {}, "cpu", 64),
    ("pbs gpu ngpus", "pbs", {}, "cuda", 8),
    ("pbs cpu", "pbs", {}, "cpu", 64),
]
ARGS = {"slurm": ("--mem=100G", "--time=24:00:00", "--constraint=ib"),
        "pbs": ("-l select=1:mem=100gb", "-l walltime=24:00:00")}


def best_ms(fn, repeat: int = 7, number: int = 200) -> float:
    return min(timeit.repeat(fn, repeat=repeat, number=number)) / number * 1000


def main() -> int:
    worst = 0.0
    print(f"{'case':<22} {'1 node':>10} {f'{NODES} nodes':>12} {'ratio':>7}")
    for label, scheduler, settings, slot_type, spn in CASES:
        config = validate_config(settings, "<bench>")
        timings = []
        for nodes in (1, NODES):
            request = Request(slots=nodes * spn, slots_per_node=spn, slot_type=slot_type, job_id="bench",
                              sbatch_args=tuple(parse_sbatch_args(ARGS["slurm"])),
                              qsub=split_qsub_args(parse_qsub_args(ARGS["pbs"])))
            header = batch_header(request)
            timings.append(best_ms(lambda r=request, c=config, s=scheduler, h=header:
                                   script_directives(make_plan(r, c, s), h)))
        base, big = timings
        worst = max(worst, big)
        print(f"{label:<22} {base:>8.3f}ms {big:>10.3f}ms {big / base:>7.2f}")
    verdict = "ok" if worst < GOAL_MS else "MISSED"
    print(f"worst {NODES}-node plan+render: {worst:.3f} ms (goal < {GOAL_MS:g} ms): {verdict}")
    record("plan.py", f"plan + render of a {NODES:,}-node request (worst case)", f"{worst:.3f} ms",
           f"< {GOAL_MS:g} ms", worst < GOAL_MS)
    return 0 if worst < GOAL_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())

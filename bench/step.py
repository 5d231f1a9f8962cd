#!/usr/bin/env python3
"""Benchmark: the cost of tether's SPANK plugin on step launch -- `srun -N3 true` inside one
3-node allocation on a private sandbox, in one run:

  none     plugstack.conf without tether
  unused   tether loaded, the step has no tether option (goal: <= 1.02 x none)
  tether   tether loaded, the step has one (per-rank directories + rank environment; goal <= 1.05)

The three kinds of steps are interleaved so drift hits all alike, and each round starts with the
next kind (none, unused, tether; unused, tether, none; ...) so no kind always follows the same one;
the median step time of each is printed, and the median of the per-round ratios with quartiles.
Then slurmstepd's memory (VmRSS of a one-task step's slurmstepd on n1, while it runs) of each kind.
Run as root:
/opt/tether/venv/bin/python bench/step.py
"""

from __future__ import annotations

import re
import statistics
import time

from tether.system.files import set_conf_line
from tether.system.proc import run_command
from tether.sandbox.cluster import Sandbox

from steps import ROOT, arguments, print_medians, step_times, timing_loop
from summary import record

CASES = {   # kind -> (untimed setup: the plugstack.conf srun and slurmstepd read, timed step)
    "none": ("cp {plugstack}.none {plugstack}.use", "srun -N3 -n3 true"),
    "unused": ("cp {plugstack}.tether {plugstack}.use", "srun -N3 -n3 true"),
    "tether": ("cp {plugstack}.tether {plugstack}.use", "srun -N3 -n3 --slot-type=cpu true"),
}


def main() -> int:
    args = arguments(__doc__, rounds=200)

    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    plugstack = box.plugstack_conf
    tether_line = next(l for l in plugstack.read_text().splitlines() if "spank_tether.so" in l)
    # srun and slurmstepd read plugstack.conf on every launch: point it at a file the loop swaps.
    plugstack.with_suffix(".conf.tether").write_text(tether_line + "\n")
    plugstack.with_suffix(".conf.none").write_text("# no plugins\n")
    use = plugstack.with_suffix(".conf.use")
    set_conf_line(box.slurm_conf, r"PlugStackConfig\s*=", f"PlugStackConfig={use}")
    use.write_text(tether_line + "\n")
    try:
        run_command(["scontrol", "reconfigure"], env=box.command_env(), timeout=60)
        time.sleep(1)
        stem = plugstack.with_suffix(".conf")
        loop = timing_loop(args.rounds, {kind: (setup.format(plugstack=stem), command)
                                         for kind, (setup, command) in CASES.items()})
        out = run_command(["salloc", "-N3", "--time=30", "bash", "-c", loop + memory_probe(stem)],
                          env=box.command_env(), timeout=1800).stdout
    finally:
        set_conf_line(box.slurm_conf, r"PlugStackConfig\s*=", f"PlugStackConfig={plugstack}")
        run_command(["scontrol", "reconfigure"], env=box.command_env(), check=False, timeout=60)
        if not args.keep:
            box.down(purge=True, log=lambda m: None)

    times = step_times(out, CASES)
    print_medians(f"srun -N3 true inside a 3-node allocation, {args.rounds} interleaved rounds", times)
    for kind, goal in (("unused", 1.02), ("tether", 1.05)):
        ratios = sorted(k / n for k, n in zip(times[kind], times["none"]))
        q1, ratio, q3 = statistics.quantiles(ratios, n=4)
        print(f"{kind} / none = {ratio:.3f} (median of per-round ratios; quartiles {q1:.3f}..{q3:.3f}; "
              f"goal <= {goal:.2f}: {'ok' if ratio <= goal else 'MISSED'})")
        record("step.py", f"`srun -N3 true`, {'tether loaded, step without its options' if kind == 'unused' else 'a tether step (directories, rank environment)'} / no plugin",
               f"{ratio:.3f} ({q1:.2f}–{q3:.2f})", f"<= {goal:.2f}", ratio <= goal)
    rss = {m.group(1): int(m.group(2)) for m in re.finditer(r"^rss (\w+) (\d+)$", out, re.M)}
    if rss:
        print("slurmstepd VmRSS of a running one-task step: " + ", ".join(
            f"{kind} {kib / 1024:.1f} MiB" for kind, kib in rss.items()))
        record("step.py", "slurmstepd VmRSS: no plugin / unused / tether step",
               " / ".join(f"{kib / 1024:.1f}" for kib in rss.values()) + " MiB")
    return 0


def memory_probe(stem) -> str:
    """Shell lines printing "rss <kind> <KiB>": a one-task step of each kind on n1, its
    slurmstepd's VmRSS read while the step sleeps (the newest "slurmstepd: [job.N]")."""
    lines = []
    for kind, (setup, command) in CASES.items():
        step = command.replace("srun -N3 -n3", "srun -N1 -n1 -w n1").replace(" true", " sleep 2")
        lines += [setup.format(plugstack=stem), f"{step} &", "sleep 1",
                  'pid=$(pgrep -n -f "slurmstepd: \\[$SLURM_JOB_ID\\.[0-9]+\\]")',
                  f'echo "rss {kind} $(awk \'/^VmRSS/ {{print $2}}\' /proc/$pid/status)"', "wait"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

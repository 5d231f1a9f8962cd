#!/usr/bin/env python3
"""Benchmark: held-sbatch throughput with no job_submit plugin, job_submit/lua doing an equivalent
rewrite (bench/job_submit.lua), and tether -- interleaved in one run on a private sandbox cluster.

The shim answers a repeated request from its cache (no Python); the throughput rounds repeat one
request, so the handler's own cost is printed separately, for distinct requests.

Every mode submits, as the unprivileged sandbox user and one after another, a held job that ends
up as the same request in slurmctld: lua and tether get ``sbatch -H --slots=4 --slots-per-node=2``
and rewrite it; "none" gets the rewritten request spelled out (``--gpus=4 --nodes=1-4
--tasks-per-node=1 --gpus-per-task=2``), so the comparison measures the plugins, not the cost of
scheduling a GPU job. The SPANK plugin is loaded in every mode (the client side costs the same). Rounds rotate the order of the modes; the
median throughput per mode and the ratios are printed, plus tether's time per call inside
slurmctld (read from its debug log in a separate tether round: the C shim times the handoff to its
worker thread and the Python handler).

Goal: tether >= 0.95 x no plugin, and >= lua.   Run as root: /opt/tether/venv/bin/python bench/submit.py
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import time
from pathlib import Path

from tether.system.proc import run_command
from tether.sandbox.cluster import Sandbox

ROOT = "/var/lib/tether/sandbox-bench"
MODES = {"none": None, "lua": "lua", "tether": "tether"}
COMMAND = ["sbatch", "-H", "--slots=4", "--slots-per-node=2", "--output=/dev/null", "--wrap", "true"]
EXPLICIT = ["sbatch", "-H", "--gpus=4", "--nodes=1-4", "--tasks-per-node=1", "--gpus-per-task=2",
            "--no-requeue", "--output=/dev/null", "--wrap", "true"]


def submit_round(box: Sandbox, jobs: int, command: list[str]) -> float:
    """Submit ``jobs`` held jobs one after another; returns jobs per second."""
    env = box.command_env()
    argv = ["runuser", "-u", box.user, "--", *command]
    start = time.perf_counter()
    for _ in range(jobs):
        run_command(argv, env=env, timeout=60)
    elapsed = time.perf_counter() - start
    run_command(["scancel", "-u", box.user], env=env, check=False, timeout=60)
    return jobs / elapsed


def rpc_times(log: Path, offset: int) -> list[int]:
    """slurmctld's own time for each batch-submit RPC logged after ``offset`` (job_submit included)."""
    with open(log, errors="replace") as fh:
        fh.seek(offset)
        return [int(m) for m in re.findall(r"_slurm_rpc_submit_batch_job: JobId=\d+ .*usec=(\d+)", fh.read())]


def check_mode(box: Sandbox, mode: str) -> None:
    """Make sure the plugin of ``mode`` is the one rewriting jobs (a reconfigure that did not take
    would make the comparison meaningless), and that every mode yields the same request."""
    env = box.command_env()
    for command, rewritten in ((COMMAND, mode != "none"), (EXPLICIT, True)):
        out = run_command(["runuser", "-u", box.user, "--", command[0], "--parsable", *command[1:]],
                          env=env).stdout.strip().split(";")[0]
        shown = run_command(["scontrol", "-o", "show", "job", out], env=env).stdout
        run_command(["scancel", out], env=env, check=False)
        if ("TresPerTask=gres:gpu:2" in shown and "NumTasks=2" in shown) != rewritten:
            raise SystemExit(f"mode {mode}: unexpected request ({shown.strip()[:300]})")


def main() -> int:
    """The benchmark as one linear script (set up, interleaved rounds, report): long, read top down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs per mode per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = parser.parse_args()

    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    shutil.copyfile(Path(__file__).with_name("job_submit.lua"), box.etc / "job_submit.lua")
    log = box.log_dir / "slurmctld.log"
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    rpc_us: dict[str, list[int]] = {m: [] for m in MODES}
    try:
        for r in range(args.rounds):
            order = list(MODES)[r % len(MODES):] + list(MODES)[:r % len(MODES)]
            for mode in order:
                box.set_job_submit_plugins(MODES[mode])
                check_mode(box, mode)
                mark = log.stat().st_size
                rates[mode].append(submit_round(box, args.jobs, EXPLICIT if mode == "none" else COMMAND))
                rpc_us[mode] += rpc_times(log, mark)
        # Time per call, measured separately (slurmctld's debug log slows every job down): the same
        # request again and again (answered from the shim's cache after the first), and distinct
        # requests (each one through the Python handler).
        box.set_job_submit_plugins("tether")
        run_command(["scontrol", "setdebug", "debug"], env=box.command_env())
        mark = log.stat().st_size
        submit_round(box, args.jobs, COMMAND)
        for slots in range(1, args.jobs + 1):
            distinct = [c if not c.startswith("--slots=") else f"--slots={slots * 2}" for c in COMMAND]
            submit_round(box, 1, distinct)
        run_command(["scontrol", "setdebug", "info"], env=box.command_env())
        with open(log, errors="replace") as fh:
            fh.seek(mark)
            text = fh.read()
        handler_us = [int(m) for m in re.findall(r"handler took (\d+) us", text)]
        cached_us = [int(m) for m in re.findall(r"cached answer took (\d+) us", text)]
    finally:
        box.set_job_submit_plugins("tether")
        if not args.keep:
            box.down(purge=True, log=lambda m: None)

    median = {m: statistics.median(v) for m, v in rates.items()}
    print(f"held sbatch throughput, {args.rounds} interleaved rounds x {args.jobs} jobs per mode "
          f"(median jobs/s; then every round)")
    for mode, rate in median.items():
        print(f"  {mode:<7} {rate:7.1f}/s   " + " ".join(f"{v:.1f}" for v in rates[mode]))
    # Paired within each round (the machine's speed drifts between rounds, not within one).
    for name, other, goal in (("none", "none", 0.95), ("lua", "lua", 1.0)):
        ratios = sorted(t / o for t, o in zip(rates["tether"], rates[other]))
        mid = statistics.median(ratios)
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        verdict = "ok" if mid >= goal else "MISSED"
        print(f"tether / {name:<4} = {mid:.3f} (median of per-round ratios, quartiles {q1:.3f}-{q3:.3f}; "
              f"goal >= {goal:.2f}: {verdict})")
    lua_ratios = [l / n for l, n in zip(rates["lua"], rates["none"])]
    print(f"lua / none    = {statistics.median(lua_ratios):.3f}")
    print("slurmctld time per submit RPC (its own usec= log field; median over all jobs): "
          + ", ".join(f"{m} {statistics.median(v):.0f} us" for m, v in rpc_us.items() if v))
    for what, values in (("through the Python handler", handler_us), ("answered from the cache", cached_us)):
        if values:
            print(f"tether per call inside slurmctld, {what}: median {statistics.median(values):.0f} us, "
                  f"p90 {sorted(values)[int(len(values) * 0.9)]} us over {len(values)} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark: what a workflow pack saves (docs/requirements.md, "Workflow packs"). A producer works
30 s and has its data ready after 5 s; a consumer needs that data.

  chain    the consumer submitted with --dependency=afterok:<producer> (plain Slurm): it starts
           when the producer has ended
  pack     a tether workflow pack (consumer delay 1 minute) whose producer runs
           `tether workflow release` once its data is ready: the consumer starts then

Both run side by side, --rounds times, on a private sandbox; printed: the consumer's start after
the producer's start (median, from sacct), and the time saved. Run as root:
/opt/tether/venv/bin/python bench/workflow.py
"""

from __future__ import annotations

import datetime
import json
import statistics
import time

from tether.sandbox.cluster import Sandbox
from tether.system.proc import run_command

from steps import ROOT, arguments

TETHER = "/opt/tether/venv/bin/tether"
PRODUCER = f"#!/bin/sh\nsleep 5\n{{release}}\nsleep 25\n"
OPTS = ["-n1", "-c1", "--time=5", "--output=/dev/null"]


def start_end(box: Sandbox, job: str) -> tuple[datetime.datetime, datetime.datetime]:
    line = run_command(["sacct", "-n", "-X", "-P", "-j", job, "-o", "Start,End"], env=box.command_env()).stdout
    start, end = line.strip().splitlines()[0].split("|")
    return datetime.datetime.fromisoformat(start), datetime.datetime.fromisoformat(end)


def main() -> int:
    args = arguments(__doc__, rounds=3)
    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    user = ["runuser", "-u", box.user, "--"]
    env = box.command_env()
    offsets: dict[str, list[float]] = {"chain": [], "pack": []}
    try:
        for _ in range(args.rounds):
            script = box.work_dir / "bench-producer.sh"
            script.write_text(PRODUCER.format(release=":"))
            producer = run_command([*user, "sbatch", "--parsable", *OPTS, str(script)], env=env, cwd="/tmp").stdout.strip()
            consumer = run_command([*user, "sbatch", "--parsable", *OPTS, f"--dependency=afterok:{producer}", "--wrap",
                                    "true"], env=env, cwd="/tmp").stdout.strip()
            spec = {"name": "bench", "jobs": [
                {"name": "producer", "sbatch_args": OPTS, "script": PRODUCER.format(release=f"{TETHER} workflow release")},
                {"name": "consumer", "delay": 1, "sbatch_args": OPTS, "command": ["true"]}]}
            out = run_command([*user, TETHER, "workflow", "submit", "--json", "-"], env=env, cwd="/tmp",
                              input=json.dumps(spec)).stdout
            pair = json.loads(out)["jobs"]
            runs = {"chain": (producer, consumer), "pack": (pair["producer"], pair["consumer"])}
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                states = run_command(["sacct", "-n", "-X", "-P", "-o", "State", "-j",
                                      ",".join(j for p in runs.values() for j in p)], env=env).stdout.split()
                if len(states) == 4 and all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for s in states):
                    break
                time.sleep(2)
            for kind, (p, c) in runs.items():
                offsets[kind].append((start_end(box, c)[0] - start_end(box, p)[0]).total_seconds())
    finally:
        if not args.keep:
            box.down(purge=True, log=lambda m: None)
    chain, pack = statistics.median(offsets["chain"]), statistics.median(offsets["pack"])
    print(f"consumer start after the producer's start, median of {args.rounds} rounds (s): "
          f"afterok chain {chain:.0f}, tether pack with release {pack:.0f}")
    print(f"  saved {chain - pack:.0f} s per hand-over (pack/chain {pack / chain:.2f}); all: {offsets}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Workflow packs (issue 18, seed 004) on the real cluster: a consumer delayed one minute after the
producer's start overlaps it; released early from inside the producer it starts within seconds;
with its dependency changed to afterok it waits for the producer's end. The three packs run at
once (two and a half minutes in all); times from sacct."""

from __future__ import annotations

import datetime
import json

import pytest
from helpers import wait_until

pytestmark = pytest.mark.cluster

TETHER = "/opt/tether/venv/bin/tether"


def pack(name: str, producer: str, producer_seconds: int) -> dict:
    return {"name": name, "jobs": [
        {"name": "producer", "sbatch_args": ["-n1", "-c1", "--time=5", "--output=/dev/null"],
         "script": f"#!/bin/sh\n{producer}\nsleep {producer_seconds}\n"},
        {"name": "consumer", "delay": 1, "sbatch_args": ["-n1", "-c1", "--time=5", "--output=/dev/null"],
         "command": ["true"]}]}


def times(cluster, job: str) -> tuple[datetime.datetime, datetime.datetime]:
    line = cluster.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "Start,End"]).stdout.strip().splitlines()[0]
    start, end = line.split("|")
    return datetime.datetime.fromisoformat(start), datetime.datetime.fromisoformat(end)


def ended(cluster, job: str) -> bool:
    state = cluster.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]).stdout.strip()
    return state.startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))


def test_delays_overlap_release_starts_the_consumer_at_once_and_afterok_waits(cluster):
    packs = {
        # Slurm acts on a fulfilled time delay at its next scheduling pass (sched_interval 60 s,
        # bf_interval 30 s by default): the consumer starts 60-120 s after the producer
        "delay": pack("delay", "true", 150),
        "release": pack("release", f"sleep 5; {TETHER} workflow release", 40),
        "afterok": pack("afterok", f"{TETHER} workflow set-dependency --type afterok", 15),
    }
    jobs = {}
    for name, spec in packs.items():
        out = cluster.as_user([TETHER, "workflow", "submit", "--json", "-"], input=json.dumps(spec)).stdout
        result = json.loads(out)
        assert result["pack"].startswith(f"{name}-")
        jobs[name] = result["jobs"]
    status = cluster.as_user([TETHER, "workflow", "status", "--json", json.loads(out)["pack"]]).stdout
    assert {r["job"] for r in json.loads(status)} == {"producer", "consumer"}
    all_jobs = [j for pair in jobs.values() for j in pair.values()]
    assert wait_until(lambda: all(ended(cluster, j) for j in all_jobs), timeout=300)
    offsets = {}
    for name, pair in jobs.items():
        p_start, p_end = times(cluster, pair["producer"])
        c_start, _ = times(cluster, pair["consumer"])
        offsets[name] = ((c_start - p_start).total_seconds(), (p_end - c_start).total_seconds())
    print(f"consumer start after the producer's start, and before its end (s): {offsets}")
    after, before_end = offsets["delay"]
    assert 55 <= after <= 130 and before_end > 0, offsets          # the delay held, and they overlapped
    after, before_end = offsets["release"]
    assert after <= 25 and before_end > 0, offsets                 # released: eligible at once
    after, before_end = offsets["afterok"]
    assert before_end <= 0, offsets                                # afterok: only once the producer ended

#!/usr/bin/env python3
"""Benchmark: the cluster image store (issue 44) with an image of a site's size -- the busybox root
plus 1 GiB of generated, incompressible files (Sandbox.large_image), pushed to the sandbox's
registry -- on a 16-node bench sandbox of its own (the issue's cluster size), as the job user, each
case on cold nodes (the user's pause processes ended, the page cache dropped) and rounds
interleaved:

  fetch      srun -N1 --container-image=BIG true, the store empty: the image service's pull and
             squashfs, then the rank's mount and start (one pull and conversion)
  new-node   srun -N1 -w <a node that never ran it> --container-image=BIG true, the image in the
             cluster store (goal <= 2 s)
  cold-all   srun -N16 --container-image=BIG true, the store empty (goal <= 1.5 x fetch)
  own-store  the same image without the cluster store: srun -N1 pulls it into the user's own store
             and runs it (what every user on every node pays without it; for comparison)

Run as root: /opt/tether/venv/bin/python bench/store.py [--rounds N] [--gib G]
(TETHER_BENCH_SANDBOX_DIR: another sandbox directory than steps.ROOT; this bench adds "-16")
"""

from __future__ import annotations

import argparse
import os
import pwd
import statistics
import subprocess
import time

from tether.sandbox.cluster import Sandbox
from tether.system.proc import run_command

from steps import ROOT
from summary import quartiles, record


def _timed(box: Sandbox, argv: list[str]) -> float:
    """Seconds one srun took, as the job user (it must succeed)."""
    start = time.monotonic()
    done = subprocess.run(["runuser", "-u", box.user, "--", *argv], env=box.command_env(), cwd=str(box.work_dir),
                          capture_output=True, timeout=1800)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return took


def _cold(box: Sandbox) -> None:
    """The nodes as between jobs: no pause process of the user, nothing of the image in memory."""
    box.cool_nodes()
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _empty_store(box: Sandbox, config: str) -> None:
    root = box.cluster_store_settings()["root"]
    for name in os.listdir(os.path.join(root, "images")):
        if name.endswith(".sqfs"):
            run_command(box.wrap([*box.tether, "images", "rm", name[:-5], "--config", config]), timeout=300)


def _forget_own(box: Sandbox, ref: str) -> None:
    for node in box.nodes:
        run_command([*box.user_podman(node), "rmi", "--force", ref], check=False, cwd="/", timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=16, help="the sandbox's nodes (cold-all runs on all)")
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = parser.parse_args()
    box = Sandbox(f"{ROOT}-{args.nodes}", nodes=args.nodes, node_prefix="bb")
    box.up(install=False, log=lambda m: None)
    try:
        rootfs = box.large_image(args.gib)
        ref = box.registry_image(repository=f"tether/large-{args.gib:g}g", rootfs=rootfs, log=lambda m: None)
        pwd.getpwnam(box.user)
        image = ["--container-image=" + ref, "true"]
        times: dict[str, list[float]] = {"fetch": [], "new-node": [], "cold-all": [], "own-store": []}
        for r in range(args.rounds):
            order = ["store", "own"] if r % 2 == 0 else ["own", "store"]
            for kind in order:
                if kind == "own":
                    _forget_own(box, ref)
                    _cold(box)
                    times["own-store"].append(_timed(box, ["srun", "-N1", "-w", box.nodes[0], *image]))
                    _forget_own(box, ref)
                    continue
                with box.cluster_store_on():
                    config = str(box.tether_conf)
                    _cold(box)
                    times["fetch"].append(_timed(box, ["srun", "-N1", "-w", box.nodes[0], *image]))
                    _cold(box)
                    times["new-node"].append(_timed(box, ["srun", "-N1", "-w", box.nodes[1], *image]))
                    _empty_store(box, config)
                    _cold(box)
                    times["cold-all"].append(_timed(box, ["srun", f"-N{args.nodes}", *image]))
    finally:
        if not args.keep:
            box.down(purge=False, log=lambda m: None)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"cluster image store, {args.gib:g} GiB image, {args.rounds} rounds (median s)")
    for kind, value in median.items():
        q1, _, q3 = quartiles(times[kind])
        print(f"  {kind:<10} {value:7.2f}   (quartiles {q1:.2f}-{q3:.2f})")
    ratio = median["cold-all"] / median["fetch"]
    print(f"  cold-all / fetch: {ratio:.2f} (goal <= 1.5)   new-node: {median['new-node']:.2f} s (goal <= 2)   "
          f"own-store / new-node: {median['own-store'] / median['new-node']:.1f}x")
    record("store", f"first rank on a new node, {args.gib:g} GiB image in the cluster store", f"{median['new-node']:.2f} s",
           "<= 2 s", median["new-node"] <= 2.0)
    record("store", f"cold {args.nodes}-node start / one pull and conversion", f"{ratio:.2f}", "<= 1.5",
           ratio <= 1.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark: what tether adds to a containerized step -- `srun -N3 ... true` in one 3-node
allocation, as the job user, with real rootless podman and the sandbox's busybox image:

  direct   srun -N3 podman run <the same podman options tether uses> --rootfs IMG:O true
  tether   srun -N3 --container-image=IMG true   (SPANK hand-off, per-rank directories, the rank
           environment, tether's launcher supervising podman; goal <= 1.10 x direct)

The two kinds of steps are interleaved so drift hits both alike; the medians are printed, and the
median of the per-round ratios (this 2-core VM runs 3 ranks on 2 cores: single steps are noisy). Run as root: /opt/tether/venv/bin/python bench/launch.py
"""

from __future__ import annotations

import shlex
import statistics

from tether.container.runtimes import adapter, podman
from tether.container.spec import LaunchSpec
from tether.system.proc import run_command
from tether.sandbox.cluster import Sandbox

from steps import ROOT, arguments, print_medians, step_times, timing_loop

def direct_podman(box: Sandbox, image: str) -> str:
    """The podman command line tether would run, minus its per-rank parts, as a shell string."""
    settings = box.tether_settings()["container"]["podman"]
    podman.stdio_is_terminal = lambda: False      # srun's tasks never are; this script may run on one
    launch = adapter("podman", settings).launch(LaunchSpec(image=image, runtime="podman", command=("true",)), {})
    argv = launch.argv[:-1]
    at = argv.index("--name")                      # three ranks on one host: podman picks names
    del argv[at:at + 2]
    return shlex.join(["env", *[f"{k}={v}" for k, v in settings["env"].items()], *argv])


def main() -> int:
    args = arguments(__doc__, rounds=15)

    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    image = box.busybox_image()
    loop = timing_loop(args.rounds, {"direct": ("", f"srun -N3 -n3 {direct_podman(box, image)} true"),
                                     "tether": ("", f"srun -N3 -n3 --container-image={image} true")})
    try:
        out = run_command(["runuser", "-u", box.user, "--", "salloc", "-N3", "--time=30", "bash", "-c", loop],
                          env=box.command_env(), cwd=str(box.work_dir), timeout=1800).stdout
    finally:
        if not args.keep:
            box.down(purge=False, log=lambda m: None)

    times = step_times(out, ("direct", "tether"))
    print_medians(f"containerized srun -N3 true inside a 3-node allocation, {args.rounds} interleaved rounds",
                  times)
    ratios = sorted(t / d for t, d in zip(times["tether"], times["direct"]))
    q1, ratio, q3 = statistics.quantiles(ratios, n=4)
    print(f"tether / direct = {ratio:.3f} (median of per-round ratios; quartiles {q1:.3f}..{q3:.3f}; "
          f"goal <= 1.10: {'ok' if ratio <= 1.10 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

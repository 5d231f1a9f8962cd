#!/usr/bin/env python3
"""Benchmark: each container runtime's own start floor on this machine, and the OCI runtime under
podman (runc, crun where it is installed) -- one-rank steps in one allocation, as the job user:

  step            srun -N1 -n1 true                                   (no container)
  podman+runc     srun -N1 -n1 podman run --runtime runc … --rootfs IMG true   (the options tether uses)
  podman+crun     the same with --runtime crun (when crun is installed; its refusal is reported)
  tether          srun -N1 -n1 --container-image=IMG true             (podman with the configured runtime)

Interleaved rounds; medians. Apptainer/Singularity and Enroot have no Debian package, so only their
stand-ins exist here: no floor of theirs is measured. Run as root: /opt/tether/venv/bin/python bench/floor.py
"""

from __future__ import annotations

import shlex
import shutil
import statistics

from tether.sandbox.cluster import Sandbox
from tether.system.proc import run_command

from launch import direct_podman
from steps import ROOT, arguments, step_times, timing_loop
from summary import record


def main() -> int:
    args = arguments(__doc__, rounds=15)
    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    image = box.busybox_image()
    runc = direct_podman(box, image)
    cases = {"step": ("", "srun -N1 -n1 true"), "podman+runc": ("", f"srun -N1 -n1 {runc} true")}
    crun_refusal = None
    if shutil.which("crun"):
        crun = runc.replace("--runtime runc", "--runtime crun")
        probe = run_command(["runuser", "-u", box.user, "--", "salloc", "-N1", "--time=5", "srun", "-N1", "-n1",
                             *shlex.split(crun), "true"], env=box.command_env(), cwd=str(box.work_dir),
                            check=False, timeout=300)
        if probe.returncode == 0:
            cases["podman+crun"] = ("", f"srun -N1 -n1 {crun} true")
        else:
            lines = [l for l in probe.stderr.splitlines() if "crun" in l or "Error" in l]
            crun_refusal = (lines or probe.stderr.splitlines() or ["exit %d" % probe.returncode])[-1].strip()
    cases["tether"] = ("", f"srun -N1 -n1 --container-image={image} true")
    try:
        out = run_command(["runuser", "-u", box.user, "--", "salloc", "-N1", "--time=30", "bash", "-c",
                           timing_loop(args.rounds, cases)], env=box.command_env(), cwd=str(box.work_dir),
                          timeout=1800).stdout
    finally:
        if not args.keep:
            box.down(purge=False, log=lambda m: None)
    times = step_times(out, cases)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"start floor of a one-rank step on this machine, {args.rounds} interleaved rounds (median ms per step)")
    for kind, ms in median.items():
        extra = "" if kind == "step" else f"   (+{ms - median['step']:.0f} ms over the bare step)"
        print(f"  {kind:<12} {ms:7.1f} ms{extra}")
        if kind != "step":
            record("floor.py", f"one-rank step, {kind}: the container's cost over a bare step",
                   f"{ms - median['step']:.0f} ms ({ms:.0f} vs {median['step']:.0f} ms)")
    if crun_refusal:
        print(f"  podman+crun  refused here: {crun_refusal}")
        record("floor.py", "one-rank step, podman+crun", f"refused here: {crun_refusal[:120]}")
    elif not shutil.which("crun"):
        print("  podman+crun  not installed")
    print("  apptainer, singularity, enroot: no Debian package; only tether's stand-ins run here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

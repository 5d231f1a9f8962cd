#!/usr/bin/env python3
"""Tight integration, measured (docs/requirements.md, "Tight integration"; issue 16): the same rank
run three ways on the sandbox (slurmdbd, proctrack/cgroup, task/cgroup with ConstrainRAMSpace and
ConstrainDevices), as the job user, with real rootless podman and the sandbox's busybox image --

  host     the program as a plain Slurm rank
  tether   srun --container-image=IMG <program>
  loose    srun podman run <options a user would pick> --rootfs IMG <program>   (by hand)

-- and what Slurm's own records and limits show for each:

  cgroups  where the rank's process sits: in Slurm's own directories of the step (task_0 for
           memory, step_0 for freezer), or in a cgroup of the runtime's below them
  cpu      sacct TotalCPU of a CPU burner of --seconds, and its ratio to the host's
  memory   the step's state in slurmdbd after the rank allocates past --mem=100M
  scancel  how often a trap on SIGTERM in the rank ran (a host rank's: once), and whether a
           container stayed in the user's podman afterwards
  devices  of the four fake GPUs, which the rank can open when it was given one (the others:
           EPERM from the devices cgroup); loose: podman by hand passes no GPU at all

Prints a Markdown table (the README's). Run as root: /opt/tether/venv/bin/python bench/tight.py
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time

from tether.sandbox.cluster import Sandbox
from tether.system.proc import run_command

from steps import ROOT

MODES = ("host", "tether", "loose")
ALLOC = "dd if=/dev/zero of=/dev/null bs=300M count=1"


class Bench:
    def __init__(self, box: Sandbox):
        self.box = box
        self.image = box.busybox_image()
        self.out = box.work_dir / f"tight-bench-{os.getpid()}"
        self.out.mkdir(exist_ok=True)
        os.chmod(self.out, 0o777)

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 300,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        return run_command(argv, env=self.box.command_env(), cwd=cwd or str(self.box.work_dir), check=check,
                           timeout=timeout)

    def podman(self) -> list[str]:
        return ["env", *self.box.podman_env(), "podman"]

    def rank(self, mode: str, script: str, mounts: bool = False) -> list[str]:
        """The srun arguments that run ``sh -c SCRIPT`` as ``mode``; /mnt is the bench's directory."""
        if mode == "host":
            return ["sh", "-c", script.replace("/mnt/", f"{self.out}/")]
        if mode == "tether":
            return [f"--container-image={self.image}", f"--container-mounts={self.out}:/mnt", "sh", "-c", script]
        return [*self.podman(), "run", "--runtime", "runc", "--network=host", "--read-only", "--rm",
                "--volume", f"{self.out}:/mnt", "--rootfs", self.image, "sh", "-c", script]

    def srun(self, *argv: str, check: bool = False) -> tuple[subprocess.CompletedProcess, str]:
        name = f"tight-{time.monotonic_ns()}"
        result = self.run(["runuser", "-u", self.box.user, "--", "srun", f"--job-name={name}", *argv], check=check)
        return result, self.job_named(name)

    def job_named(self, name: str) -> str:
        for _ in range(150):
            ids = self.run(["sacct", "-n", "-X", "-P", f"--name={name}", "-u", self.box.user, "-o", "JobID",
                            "-S", "now-1hours"]).stdout.split()
            if ids:
                return ids[-1]
            time.sleep(0.2)
        raise RuntimeError(f"no job {name} in slurmdbd")

    def step0(self, job: str, fields: str) -> dict[str, str]:
        """The job's step 0 record in slurmdbd, once it has ended there."""
        names = fields.split(",")
        for _ in range(300):
            rows = [line.split("|") for line in self.run(["sacct", "-n", "-P", "-j", job, "-o", fields + ",End"]
                                                         ).stdout.splitlines()]
            step = next((r for r in rows if r[0].endswith(".0")), None)
            if step and step[-1] not in ("", "Unknown"):
                return dict(zip(names, step))
            time.sleep(0.2)
        raise RuntimeError(f"job {job}: step 0 never ended in slurmdbd")

    # ---- the measurements ----------------------------------------------------------------------
    def cgroups(self, mode: str) -> str:
        result, _ = self.srun("-N1", "-n1", *self.rank(mode, "grep -E ':(memory|freezer):' /proc/self/cgroup"))
        paths = dict(line.split(":", 2)[1:] for line in result.stdout.split() if line.count(":") >= 2)
        memory, freezer = paths.get("memory", "?"), paths.get("freezer", "?")
        if re.search(r"/step_0/task_0$", memory) and re.search(r"/step_0$", freezer):
            return "Slurm's own (task_0, step_0)"
        return f"runtime's child: `{memory.rsplit('/', 2)[-2]}/{memory.rsplit('/', 1)[-1][:12]}…`"

    def cpu(self, mode: str, seconds: int) -> float:
        burn = f"timeout {seconds} sh -c 'while :; do :; done'; true"
        _, job = self.srun("-N1", "-n1", *self.rank(mode, burn), check=True)
        total = self.step0(job, "JobID,TotalCPU")["TotalCPU"]
        minutes, _, secs = total.rpartition(":")
        return float(secs) + 60 * float(minutes.rpartition(":")[2] or 0)

    def memory(self, mode: str) -> str:
        _, job = self.srun("-N1", "-n1", "--mem=100M", *self.rank(mode, ALLOC))
        return self.step0(job, "JobID,State")["State"]

    def scancel(self, mode: str) -> tuple[int, bool]:
        tag = f"{mode}-{time.monotonic_ns()}"
        trap = f"trap 'echo term >> /mnt/term-{tag}' TERM; echo up > /mnt/up-{tag}; while :; do sleep 1; done"
        argv = self.rank(mode, trap)
        if mode == "loose":
            argv[argv.index("--rm") + 1:argv.index("--rm") + 1] = ["--name", f"loose-{tag}"]
        proc = subprocess.Popen(["runuser", "-u", self.box.user, "--", "srun", f"--job-name={tag}", "-N1", "-n1",
                                 "-w", self.box.nodes[0], *argv], env=self.box.command_env(), cwd=str(self.box.work_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(450):
            if (self.out / f"up-{tag}").exists() or proc.poll() is not None:
                break
            time.sleep(0.2)
        job = self.job_named(tag)
        self.run(["scancel", job])
        proc.wait(timeout=120)
        ended = time.monotonic()
        prefix = f"loose-{tag}" if mode == "loose" else f"tether-{job}-"
        # by hand: the user's own podman store on the node; tether: the user's tether store there
        podman = (self.box.on_node(None, ["runuser", "-u", self.box.user, "--", *self.podman()]) if mode == "loose"
                  else self.box.user_podman())
        while True:        # slurmstepd removes a container podman still lists once the step is over
            names = self.run([*podman, "ps", "-a", "--format", "{{.Names}}"], check=False, cwd="/").stdout.split()
            left = [n for n in names if n.startswith(prefix)]
            if not left or time.monotonic() - ended > 60:
                break
            time.sleep(1)
        for name in left:
            self.run([*podman, "rm", "--force", name], check=False, cwd="/")
        term = self.out / f"term-{tag}"
        return term.read_text().count("term") if term.exists() else 0, bool(left)

    def devices(self, mode: str) -> str:
        if mode == "loose":
            return "no GPU passed (by hand)"
        probe = "for f in /dev/tether-fakegpu*; do (exec 3<$f) 2>&1 | grep -q 'No such device or address' && echo $f; done"
        extra = [f"--container-image={self.image}"] if mode == "tether" else []
        result, _ = self.srun("-p", "gpu", "-N1", "-n1", "--gpus=1", *extra, "sh", "-c", probe)
        opened = result.stdout.split()
        return f"{len(opened)} of 4 opens ({', '.join(os.path.basename(p) for p in opened)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=15, help="the CPU burner's run time")
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = parser.parse_args()
    seconds = args.seconds
    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    rows: dict[str, dict[str, str]] = {}
    try:
        bench = Bench(box)
        cpu = {}
        for mode in MODES:
            count, left = bench.scancel(mode)
            cpu[mode] = bench.cpu(mode, seconds)
            rows[mode] = {"cgroups": bench.cgroups(mode),
                          "memory": bench.memory(mode),
                          "scancel": f"trap ran {count}x; " + ("container left in podman" if left else "nothing left"),
                          "devices": bench.devices(mode)}
        for mode in MODES:
            rows[mode]["cpu"] = f"{cpu[mode]:.1f} s ({cpu[mode] / cpu['host']:.2f} x host)"
    finally:
        if not args.keep:
            box.down(purge=False, log=lambda m: None)

    print(f"Tight integration on the sandbox (sacct, slurmdbd, cgroup v1; a {seconds} s burner; --mem=100M):\n")
    print("| | " + " | ".join(MODES) + " |")
    print("|---|" + "---|" * len(MODES))
    for key, label in (("cgroups", "rank's cgroups"), ("cpu", "sacct TotalCPU"), ("memory", "past --mem: step state"),
                       ("scancel", "scancel: SIGTERM trap"), ("devices", "1 GPU of 4 given")):
        print(f"| {label} | " + " | ".join(rows[m][key] for m in MODES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark: what a job_submit plugin costs slurmctld per submission -- no plugin, job_submit/lua
doing an equivalent rewrite (bench/job_submit.lua), and tether -- interleaved in one run on a
private sandbox cluster.

**Distinct requests** are the main figure: real submissions differ (sizes, names, images, the
directories they mount). Each job of a round gets its own slot layout (9 of them: ``--slots`` 1-12
with ``--slots-per-node`` 1, 2 or 4), job name, time limit, container image tag
(``--container-image=bench/app:r<round>-<job>``) and mounted directory
(``--container-mounts=/bench/<round>-<job>:/data:ro``, as pyxis users mount ``$PWD``), container
name (``--container-name=b<round>-<job>``) and file to save the container to
(``--container-save=/bench/<round>-<job>.sqsh``), so no two requests of a run are the same. To
tether they are one *shape* (the request less its slot counts, image, ``--container-env`` names,
plain bind mounts, ``--container-workdir``, ``--container-name`` and a plain absolute
``--container-save``): its C shim answers all but the first of a run from its shape cache, with no
Python. The **cached repeat** (one request again and again) is the second figure, and **new
shapes** the third: each request saves its container to a *relative* file of its own
(``--container-save=<round>-<job>.sqsh``), whose check depends on the working directory, so the
shim keeps it in the shape and each one goes to the Python handler -- the cost of the first
request of each shape (after slurmctld starts or the config changes). (Before issue 43's C checks,
new shapes were requests naming their own ``--container-env`` variable, then mounting their own
directory, then naming their own container, then saving to an absolute file of their own; all
are one shape now.)

Every mode submits, as the unprivileged sandbox user and one after another, held jobs that end up
as the same requests in slurmctld: lua and tether get ``sbatch -H --slots=S --slots-per-node=P``
and rewrite it; "none" gets the rewritten request spelled out (``--gpus=S --nodes=1-S
--tasks-per-node=1 --gpus-per-task=P``), so the comparison measures the plugins, not the cost of
scheduling a GPU job. The SPANK plugin is loaded in every mode (the client side costs the same).
Rounds rotate the order of the modes.

Printed: throughput per mode and its ratio to none and to lua (median of per-round ratios, with
quartiles); each plugin's **cost per call inside slurmctld**: slurmctld's mean time for the
submit RPC in the round (``sdiag``'s REQUEST_SUBMIT_BATCH_JOB total_time / count, reset before
each round: measured around the whole RPC, job_submit included) less no plugin's in the same
round, quartiles over the rounds; and, from a debug round, where tether's time goes (the Python
handler on slurmctld's thread; for a call on its worker thread, the hand-off, the handler, the
wake-up of the RPC thread: the shim logs each); and
slurmctld's memory per mode (VmRSS, and apart its own, RssAnon, from the file pages it maps,
RssFile), each from a fresh slurmctld that answered a dozen requests.

Not the ``usec=`` of slurmctld's "_slurm_rpc_submit_batch_job" log line: in 22.05 that timer is
restarted after job_submit has run (proc_req.c, "Restart after we have locks"), so it leaves the
plugins out (an earlier version of this benchmark read it). job_submit runs under the job *read*
lock and slurmctld's g_context_lock (job_submit.c): one plugin call at a time.

Goals (issue 21): tether >= 0.95 x no plugin; tether's cost per distinct call <= lua's.
Run as root: /opt/tether/venv/bin/python bench/submit.py
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

from summary import record

ROOT = "/var/lib/tether/sandbox-bench"
MODES = {"none": None, "lua": "lua", "tether": "tether"}
LAYOUTS = [(s, p) for p in (1, 2, 4) for s in (p, 2 * p, 3 * p)]     # at most 3 nodes x 4 GPUs


KINDS = ("distinct", "cached", "new shapes")


def command(mode: str, k: int, tag: str, new_shape: bool = False) -> list[str]:
    """The k-th request of a round: its own layout, name, time limit, image tag, mounted
    directory, container name and --container-save file (relative with ``new_shape``)."""
    slots, per_node = LAYOUTS[k % len(LAYOUTS)]
    common = ["-H", f"--job-name=bench-{tag}-{k}", f"--time={10 + k % 50}", "--output=/dev/null",
              f"--container-image=bench/app:{tag}-{k}", f"--container-mounts=/bench/{tag}-{k}:/data:ro",
              f"--container-name=b{tag}-{k}",
              # its own file to save the container to: absolute (a shape's class), or relative (the handler's)
              f"--container-save={'' if new_shape else '/bench/'}{tag}-{k}.sqsh"]
    if mode == "none":         # the rewrite spelled out (what lua and tether make of --slots)
        return ["sbatch", *common, f"--gpus={slots}", f"--nodes=1-{slots}", "--tasks-per-node=1",
                f"--gpus-per-task={per_node}", "--no-requeue", "--wrap", "true"]
    return ["sbatch", *common, f"--slots={slots}", f"--slots-per-node={per_node}", "--wrap", "true"]


def submit_round(box: Sandbox, commands: list[list[str]]) -> float:
    """Submit the commands one after another as the sandbox user; jobs per second."""
    env = box.command_env()
    start = time.perf_counter()
    for argv in commands:
        run_command(["runuser", "-u", box.user, "--", *argv], env=env, timeout=60)
    elapsed = time.perf_counter() - start
    run_command(["scancel", "-u", box.user], env=env, check=False, timeout=60)
    return len(commands) / elapsed


def log_since(log: Path, offset: int) -> str:
    with open(log, errors="replace") as fh:
        fh.seek(offset)
        return fh.read()


def sdiag_reset(box: Sandbox) -> None:
    run_command(["sdiag", "--reset"], env=box.command_env(), timeout=60)


def sdiag_submit_us(box: Sandbox) -> float:
    """slurmctld's mean time per batch-submit RPC since the last reset, job_submit included."""
    out = run_command(["sdiag"], env=box.command_env(), timeout=60).stdout
    m = re.search(r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)", out)
    if not m:
        raise SystemExit(f"sdiag shows no batch submissions:\n{out}")
    return int(m.group(2)) / int(m.group(1))


def check_mode(box: Sandbox, mode: str) -> None:
    """Make sure the plugin of ``mode`` is the one rewriting jobs (a reconfigure that did not take
    would make the comparison meaningless), and that every mode yields the same request."""
    env = box.command_env()
    for argv, rewritten in ((command("tether", 4, "check"), mode != "none"), (command("none", 4, "check"), True)):
        out = run_command(["runuser", "-u", box.user, "--", argv[0], "--parsable", *argv[1:]],
                          env=env).stdout.strip().split(";")[0]
        shown = run_command(["scontrol", "-o", "show", "job", out], env=env).stdout
        run_command(["scancel", out], env=env, check=False)
        if ("TresPerTask=gres:gpu:2" in shown and "NumTasks=2" in shown) != rewritten:
            raise SystemExit(f"mode {mode}: unexpected request ({shown.strip()[:300]})")


def ctld_rss_mib(box: Sandbox) -> dict[str, float]:
    """slurmctld's VmRSS, and its parts: RssAnon (its own memory: heaps, the interpreter's objects)
    and RssFile (file pages it maps, libpython's code among them: shared with every process that
    maps the same file, and dropped under memory pressure), in MiB."""
    pid = (box.run_dir / "slurmctld.pid").read_text().split()[0]
    status = Path(f"/proc/{pid}/status").read_text()
    return {field: int(re.search(rf"^{field}:\s+(\d+)", status, re.M).group(1)) / 1024
            for field in ("VmRSS", "RssAnon", "RssFile")}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    v = sorted(values)
    return v[len(v) // 4], statistics.median(v), v[(3 * len(v)) // 4]


def main() -> int:
    """The benchmark as one linear script (set up, interleaved rounds, report): long, read top down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=36, help="jobs per mode per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = parser.parse_args()

    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    shutil.copyfile(Path(__file__).with_name("job_submit.lua"), box.etc / "job_submit.lua")
    log = box.log_dir / "slurmctld.log"
    kinds = KINDS
    rates = {k: {m: [] for m in MODES} for k in kinds}
    rpc_us = {k: {m: [] for m in MODES} for k in kinds}
    memory: dict[str, dict[str, float]] = {}
    try:
        for mode in MODES:          # a fresh slurmctld per mode (a plugin once loaded stays mapped)
            box.set_job_submit_plugins(MODES[mode])
            box.restart_slurmctld()
            check_mode(box, mode)
            submit_round(box, [command(mode, k, f"mem-{mode}") for k in range(12)])
            memory[mode] = ctld_rss_mib(box)
        for r in range(args.rounds):
            order = list(MODES)[r % len(MODES):] + list(MODES)[:r % len(MODES)]
            for mode in order:
                box.set_job_submit_plugins(MODES[mode])
                check_mode(box, mode)
                for kind in kinds:
                    commands = ([command(mode, 4, f"r{r}")] * args.jobs if kind == "cached" else
                                [command(mode, k, f"r{r}", kind == "new shapes") for k in range(args.jobs)])
                    sdiag_reset(box)
                    rates[kind][mode].append(submit_round(box, commands))
                    rpc_us[kind][mode].append(sdiag_submit_us(box))
        # Where tether's time goes, measured apart (slurmctld's debug log slows every job down).
        box.set_job_submit_plugins("tether")
        run_command(["scontrol", "setdebug", "debug"], env=box.command_env())
        mark = log.stat().st_size
        submit_round(box, [command("tether", k, "debug", True) for k in range(args.jobs)])
        submit_round(box, [command("tether", k, "debug") for k in range(args.jobs)])
        submit_round(box, [command("tether", 4, "debug")] * args.jobs)
        run_command(["scontrol", "setdebug", "info"], env=box.command_env())
        text = log_since(log, mark)
        split = re.findall(r"handler took (\d+) us \(hand-off (\d+), Python (\d+), back (\d+)\)", text)
        here = re.findall(r"handler took (\d+) us \(on this thread, Python (\d+)\)", text)
        cached_us = [int(m) for m in re.findall(r"cached answer took (\d+) us", text)]
        shaped_us = [int(m) for m in re.findall(r"answer by its shape took (\d+) us", text)]
    finally:
        box.set_job_submit_plugins("tether")
        if not args.keep:
            box.down(purge=True, log=lambda m: None)

    for kind in kinds:
        print(f"held sbatch throughput, {kind} requests: {args.rounds} interleaved rounds x {args.jobs} jobs "
              f"per mode (median jobs/s; then every round)")
        for mode, values in rates[kind].items():
            print(f"  {mode:<7} {statistics.median(values):7.1f}/s   " + " ".join(f"{v:.1f}" for v in values))
        # paired within each round (the machine's speed drifts between rounds, not within one)
        for other, goal in (("none", 0.95 if kind != "new shapes" else None), ("lua", None)):
            q1, mid, q3 = quartiles([t / o for t, o in zip(rates[kind]["tether"], rates[kind][other])])
            verdict = "" if goal is None else f"; goal >= {goal:.2f}: {'ok' if mid >= goal else 'MISSED'}"
            print(f"  tether / {other:<4} = {mid:.3f} (per-round ratios, quartiles {q1:.3f}-{q3:.3f}{verdict})")
        q1, mid, q3 = quartiles([l / n for l, n in zip(rates[kind]["lua"], rates[kind]["none"])])
        print(f"  lua / none    = {mid:.3f} (quartiles {q1:.3f}-{q3:.3f})")
        print(f"  slurmctld time per submit RPC (sdiag, per-round means; quartiles): " + ", ".join(
            f"{m} {'-'.join(f'{x:.0f}' for x in quartiles(v))} us" for m, v in rpc_us[kind].items()))
        cost = {m: quartiles([a - b for a, b in zip(rpc_us[kind][m], rpc_us[kind]["none"])]) for m in ("lua", "tether")}
        goal = "" if kind != "distinct" else \
            f"; goal tether <= lua: {'ok' if cost['tether'][1] <= cost['lua'][1] else 'MISSED'}"
        print(f"  cost per call inside slurmctld (less none's in the same round; quartiles): " + ", ".join(
            f"{m} {'-'.join(f'{x:.0f}' for x in q)} us" for m, q in cost.items()) + goal)
        q1, mid, q3 = quartiles([t / o for t, o in zip(rates[kind]["tether"], rates[kind]["none"])])
        record("submit.py", f"{kind} requests: sbatch throughput, tether / no plugin",
               f"{mid:.2f} ({q1:.2f}–{q3:.2f})", ">= 0.95" if kind != "new shapes" else "",
               mid >= 0.95 if kind != "new shapes" else None)
        record("submit.py", f"{kind} requests: cost per call inside slurmctld, tether vs job_submit/lua",
               f"{cost['tether'][1]:.0f} µs vs {cost['lua'][1]:.0f} µs",
               "<= lua's" if kind == "distinct" else "",
               cost["tether"][1] <= cost["lua"][1] if kind == "distinct" else None)
    for rows, names, where in ((split, ("total", "hand-off", "Python handler", "back"), "on its worker thread"),
                               (here, ("total", "Python handler"), "on slurmctld's thread")):
        if rows:
            parts = list(zip(*[[int(x) for x in row] for row in rows]))
            print(f"tether's calls to its Python handler {where}, where the time goes (debug round, {len(rows)} "
                  f"calls; quartiles): " + ", ".join(
                      f"{n} {'-'.join(str(x) for x in quartiles(list(v)))} us" for n, v in zip(names, parts)))
    if here:
        q1, mid, q3 = quartiles([int(row[1]) for row in here])
        record("submit.py", "new shapes: tether's Python handler on slurmctld's thread (debug log)",
               f"{mid:.0f} ({q1:.0f}–{q3:.0f}) µs")
    print("slurmctld VmRSS after a dozen submissions, a fresh slurmctld per mode: " + ", ".join(
        f"{m} {v['VmRSS']:.1f} MiB" + (f" (+{v['VmRSS'] - memory['none']['VmRSS']:.1f})" if m != "none" else "")
        for m, v in memory.items()))
    print("  of which its own (RssAnon) / file pages it maps, shared (RssFile): " + ", ".join(
        f"{m} {v['RssAnon']:.1f} / {v['RssFile']:.1f} MiB" for m, v in memory.items()))
    record("submit.py", "slurmctld VmRSS: no plugin / lua / tether",
           " / ".join(f"{memory[m]['VmRSS']:.1f}" for m in MODES) + " MiB")
    record("submit.py", "slurmctld's own memory (RssAnon): no plugin / lua / tether",
           " / ".join(f"{memory[m]['RssAnon']:.1f}" for m in MODES) + " MiB")
    if shaped_us:
        q1, mid, q3 = quartiles(shaped_us)
        record("submit.py", "tether's answer by shape, in its C shim (debug log)", f"{mid:.0f} ({q1:.0f}–{q3:.0f}) µs")
    for what, values in (("answers by shape", shaped_us), ("cached answers", cached_us)):
        if values:
            print(f"tether's {what} in its C shim: {'-'.join(str(x) for x in quartiles(values))} us (quartiles, "
                  f"{len(values)} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

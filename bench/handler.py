#!/usr/bin/env python3
"""Benchmark, no cluster: the job_submit handler's cost per new-shape request, and what it costs
slurmctld to load.

A job_submit request of a shape the C shim has not seen (bench/submit.py's "new shapes") is
answered by the Python handler, inside slurmctld's job_submit call (its job lock held). This
measures that Python part in this process, as the shim's worker thread calls it: ``handler.call
("submit", job, uid, 1)`` (build.py's ``tether_py_submit``) on a ``tether_job_t`` built from the
same requests bench/submit.py sends (its ``command(..., new_shape=True)``: ``--slots`` /
``--slots-per-node`` of its 9 layouts, a ``--container-image``, a ``--container-mounts`` and a
``--container-name`` of its own, forwarded as the SPANK plugin does: ``TETHER_<NAME>`` and Slurm's
``_SLURM_SPANK_OPTION_tether_<name>``; and their values read and checked, as the shim's C hands
them over), with the sandbox's tether.yaml (Sandbox.tether_settings) and a slurm.conf shaped like
the sandbox's. The struct is a cffi struct of bridge.h's declarations (the plugin's own layout);
the shim's config check is taken as done (``config_current``), as it is for a call after the first.

Printed: the median per-call time (and quartiles) over ``--calls`` calls, timed one by one with
``time.perf_counter_ns`` after ``--warmup`` calls -- hot (one call after another), and cold over
``--cold-calls`` (the CPU caches flushed before each call, as slurmctld's own work between two
submissions leaves them: closer to what its log's "Python" time shows); what loading costs, each
in a fresh interpreter configured as worker.c's (isolated, no ``site``): the modules the handler
imports and their import time (``-X importtime``, the largest), the Python memory they hold
(tracemalloc) and the process's RSS growth, after the import, after the handler's init (the config
read) and after 36 new-shape submissions. bench/submit.py's new shapes share 9 slot layouts, so
after the first few the handler answers them from plans it made before; ``--fresh-plans`` gives
each request its own ``--slots`` (a plan made for it alone). ``--profile`` prints cProfile's view
of the calls instead of timing them. Against another install: run this file with its Python.

Not measured here: the C side (the copy of job_desc, the hand-off to the worker thread and back)
and slurmctld's own work; bench/submit.py measures the whole call inside a real slurmctld.
Run: /opt/tether/venv/bin/python bench/handler.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
EVICT_BYTES = 64 << 20      # twice this machine's last-level cache (32 MiB)
SLURM_CONF = """\
ClusterName=bench
NodeName=node[1-3] CPUs=4 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=node[1-3] MaxTime=INFINITE State=UP
PartitionName=aux Nodes=node[1-3] MaxTime=INFINITE State=UP
PartitionName=gateway Nodes=node3 MaxTime=INFINITE State=UP
"""

# What plugin.c gives the handler, and the request snapshot it fills: one text, run both here and
# in the fresh interpreters of the load measurement (which must import nothing the handler does not).
HARNESS = '''
NO_VAL, NO_VAL16 = 0xfffffffe, 0xfffe


class Lib:
    """bridge.h's calls into C, doing nothing; Slurm 22.05's constants (the host's Slurm)."""

    NO_VAL, NO_VAL16, SLURM_VERSION_NUMBER = NO_VAL, NO_VAL16, (22 << 16) + (5 << 8) + 8

    def tether_log(self, level, msg):
        pass

    def tether_set_health(self, broken, reject_all, reason):
        pass

    def tether_config_loaded(self, *args):
        pass

    def tether_partitions_loaded(self, *args):
        pass

    def tether_answers_per_user(self, yes):
        pass


def make_job(ffi, env, uid, keep):
    """A tether_job_t as plugin.c copies it from sbatch's job_desc: no --nodes, --ntasks, ... given;
    with the option values its C reads and checks (request.c; test_shape_cache holds them to the
    handler's own reading, which makes them here)."""
    from tether.job_submit.handler import checked_values, tether_values

    job = ffi.new("tether_job_t *")
    job.min_nodes = job.max_nodes = job.num_tasks = job.het_job_offset = NO_VAL
    job.ntasks_per_node = job.cpus_per_task = NO_VAL16
    job.user_id = uid
    entries = [ffi.new("char[]", e.encode()) for e in env]
    array = ffi.new("char *[]", entries)
    keep += entries
    keep.append(array)
    job.spank_env, job.spank_env_size = array, len(entries)
    job.config_current = 1      # the shim checked the config file a moment ago
    values = b"".join(f"{k}\\0{v}\\0".encode() for k, v in checked_values(tether_values(env)).items())
    # its mounts are plain bind mounts, as request.c finds (bench/submit.py's /bench/<tag>-<k>:/data:ro)
    mounts = next((e.split("=", 1)[1] for e in env if e.startswith("TETHER_CONTAINER_MOUNTS=")), "")
    assert mounts.startswith("/bench/") and mounts.endswith(":/data:ro") and mounts.count(":") == 2, mounts
    job.plain_mounts = 1
    buf = ffi.new("char[]", values + b"\\0")
    keep.append(buf)
    job.values, job.values_size = buf, len(values)
    return job
'''

# A fresh interpreter as worker.c starts one: load the bridge, import the handler, bind, init,
# submit; report RSS, modules and (under -X tracemalloc) Python's own allocations at each stage.
CHILD = '''
import sys
sys.path[:0] = PATHS
import os
os.environ["TETHER_CONFIG"], os.environ["SLURM_CONF"] = CONFIG, SLURM_CONF_PATH


def rss():
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmRSS")).split()[1]) * 1024


if "tracemalloc" in sys._xoptions:
    import _tracemalloc


def traced():
    return _tracemalloc.get_traced_memory()[0] if "tracemalloc" in sys._xoptions else 0


stages = []


def stage(name):
    stages.append((name, rss(), traced(), sorted(sys.modules)))


stage("interpreter")
from _bench_bridge import ffi
stage("bridge")
from tether.job_submit import handler
stage("import")
lib = Lib()
h = handler.bind(ffi, lib)
assert h.init() == handler.ACCEPT, h.reason
stage("init")
keep = []
for env in JOBS:
    assert handler.call("submit", make_job(ffi, env, UID, keep), UID, 1) == handler.ACCEPT
stage("submits")
print(repr(stages))
'''


def spank_env(argv: list[str]) -> list[str]:
    """What sbatch forwards to slurmctld for ``argv``'s tether options: Slurm's
    ``_SLURM_SPANK_OPTION_tether_<name>`` and the SPANK plugin's ``TETHER_<NAME>`` (client.c)."""
    from tether.hooks.surface import BY_NAME

    env = []
    for arg in argv:
        name, eq, value = arg[2:].partition("=")
        if arg.startswith("--") and eq and name in BY_NAME:
            env += [f"{BY_NAME[name].spank_env}={value}", f"{BY_NAME[name].env}={value}"]
    return env


def new_shape_requests(count: int, jobs_per_round: int = 36, fresh_plans: bool = False) -> list[list[str]]:
    """bench/submit.py's new-shape requests (its rounds' tags), as spank_job_env lists; with
    ``fresh_plans`` each asks for a plan no other one does (its own --slots: a multiple of its
    --slots-per-node), so none is answered from the handler's plans made before."""
    sys.path.insert(0, str(BENCH))
    from submit import command

    out = []
    for n in range(count):
        argv = command("tether", n % jobs_per_round, f"r{n // jobs_per_round}", True)
        if fresh_plans:
            per_node = next(int(a.split("=")[1]) for a in argv if a.startswith("--slots-per-node="))
            argv = [f"--slots={per_node * (n + 1)}" if a.startswith("--slots=") else a for a in argv]
        out.append(spank_env(argv))
    return out


def setup(work: Path) -> tuple[Path, Path]:
    """The sandbox's tether.yaml and a slurm.conf like its own, in ``work``; and bridge.h's
    declarations as an out-of-line cffi module (``_bench_bridge``: _cffi_backend only, as the
    plugin's compiled module) there."""
    import yaml

    from tether.sandbox.cluster import Sandbox
    from tether.testing.slurm import bridge_ffi

    config = work / "tether.yaml"
    config.write_text(yaml.safe_dump(Sandbox(work / "sandbox").tether_settings(), sort_keys=False))
    slurm_conf = work / "slurm.conf"
    slurm_conf.write_text(SLURM_CONF)
    ffi = bridge_ffi()
    ffi.set_source("_bench_bridge", None)
    ffi.emit_python_code(str(work / "_bench_bridge.py"))
    return config, slurm_conf


def handler_module(work: Path, config: Path, slurm_conf: Path):
    """The handler module, bound as the plugin's init code binds it, its config loaded."""
    os.environ["TETHER_CONFIG"], os.environ["SLURM_CONF"] = str(config), str(slurm_conf)
    sys.path.insert(0, str(work))
    from _bench_bridge import ffi

    from tether.job_submit import handler

    scope: dict = {}
    exec(HARNESS, scope)
    h = handler.bind(ffi, scope["Lib"]())
    if h.init() != handler.ACCEPT:
        raise SystemExit(f"the handler did not load {config}: {h.reason}")
    return handler, ffi, scope["make_job"]


def time_calls(handler, ffi, make_job, requests: list[list[str]], warmup: int, cold: bool = False) -> list[int]:
    """Nanoseconds of each call (after ``warmup`` calls of other requests); every answer checked.
    ``cold``: the CPU's caches flushed before each call (a buffer larger than the last-level cache
    copied), as slurmctld's other work leaves them between two submissions."""
    uid, keep = os.getuid(), []
    jobs = [make_job(ffi, env, uid, keep) for env in requests]
    call, clock = handler.call, time.perf_counter_ns
    src, dst = (bytearray(EVICT_BYTES), bytearray(EVICT_BYTES)) if cold else (b"", bytearray())
    times = []
    for i, job in enumerate(jobs):
        if cold:
            dst[:] = src
        start = clock()
        rc = call("submit", job, uid, 1)
        elapsed = clock() - start
        if rc != handler.ACCEPT or ffi.string(job.msg) or not job.shaped:
            raise SystemExit(f"request {requests[i]}: answer {rc}, {ffi.string(job.msg)!r}")
        if i >= warmup:
            times.append(elapsed)
    return times


def profile_calls(handler, ffi, make_job, requests: list[list[str]], top: int) -> None:
    import cProfile
    import pstats

    uid, keep = os.getuid(), []
    jobs = [make_job(ffi, env, uid, keep) for env in requests]
    profiler = cProfile.Profile()
    profiler.enable()
    for job in jobs:
        handler.call("submit", job, uid, 1)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def load_cost(work: Path, config: Path, slurm_conf: Path, requests: list[list[str]]) -> dict:
    """The load measurements, each in a fresh interpreter (worker.c's: isolated, no site)."""
    import sysconfig

    import tether

    paths = [str(work), str(Path(tether.__path__[0]).parent), sysconfig.get_paths()["platlib"]]
    code = (HARNESS + f"PATHS, CONFIG, SLURM_CONF_PATH, UID = {paths!r}, {str(config)!r}, "
            f"{str(slurm_conf)!r}, {os.getuid()}\nJOBS = {requests!r}\n" + CHILD)

    def run(*options: str) -> tuple[list, str]:
        done = subprocess.run([sys.executable, "-I", "-S", *options, "-c", code], capture_output=True,
                              text=True, check=False)
        if done.returncode:
            raise SystemExit(f"the load measurement failed:\n{done.stderr}")
        return eval(done.stdout), done.stderr   # noqa: S307 - our own child's repr of plain data

    plain = [run()[0] for _ in range(3)]
    stages = [(name, statistics.median(p[i][1] for p in plain), mods) for i, (name, _, _, mods) in
              enumerate(plain[0])]
    traced = run("-X", "tracemalloc")[0]
    importtime = run("-X", "importtime")[1]
    imports = []
    for line in importtime.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and parts[0].split(":")[1].strip().isdigit():
            imports.append((int(parts[0].split(":")[1]), int(parts[1]), parts[2].rstrip()))
    return {"stages": stages, "traced": [(s[0], s[2]) for s in traced], "imports": imports}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3600, help="timed calls (default 3600: 100 rounds of 36)")
    parser.add_argument("--cold-calls", type=int, default=720, help="timed calls with the caches flushed before each")
    parser.add_argument("--warmup", type=int, default=360)
    parser.add_argument("--profile", action="store_true", help="cProfile the calls instead of timing them")
    parser.add_argument("--top", type=int, default=30, help="functions --profile prints")
    parser.add_argument("--fresh-plans", action="store_true",
                        help="give each request its own --slots: no plan asked for twice (the handler plans each)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    sys.path.insert(0, str(BENCH))
    from summary import quartiles, record

    with tempfile.TemporaryDirectory(prefix="tether-bench-handler-") as tmp:
        work = Path(tmp)
        config, slurm_conf = setup(work)
        requests = new_shape_requests(args.warmup + args.calls, fresh_plans=args.fresh_plans)
        if args.profile:
            profile_calls(*handler_module(work, config, slurm_conf), requests, args.top)
            return 0
        load = load_cost(work, config, slurm_conf, requests[:36])
        bound = handler_module(work, config, slurm_conf)
        hot = time_calls(*bound, requests, args.warmup)
        cold = time_calls(*bound, requests[:args.warmup + args.cold_calls], args.warmup, cold=True)

    figures = {}
    for kind, times in (("hot", hot), ("cold", cold)):
        us = [t / 1000 for t in times]
        figures[kind] = q1, mid, q3 = quartiles(us)
        print(f"job_submit handler, new-shape requests (bench/submit.py's{', each its own plan' * args.fresh_plans}), "
              f"in-process, {kind} "
              f"({'one call after another' if kind == 'hot' else 'CPU caches flushed before each call'}): "
              f"{len(us)} calls, median {mid:.1f} us per call (quartiles {q1:.1f}-{q3:.1f}, min {min(us):.1f})")
        record("handler.py", f"new-shape request{', its own plan' * args.fresh_plans}: the Python handler's time "
                             f"per call (in-process, {kind})",
               f"{mid:.0f} ({q1:.0f}–{q3:.0f}) µs")

    stages, base = load["stages"], load["stages"][0]
    print(f"loading in a fresh interpreter as worker.c's (its own RSS {base[1] / 2**20:.1f} MiB; growth: median of "
          f"3 runs; Python's own allocations by tracemalloc; modules in sys.modules):")
    for (name, rss, mods), (_, traced) in zip(stages, load["traced"]):
        print(f"  {name:<12} RSS +{(rss - base[1]) / 2**20:5.1f} MiB   traced {traced / 2**20:5.2f} MiB   "
              f"{len(mods) - len(base[2]):3d} modules")
    imported = sorted(set(stages[-1][2]) - set(stages[1][2]))
    print(f"  the handler's modules ({len(imported)}): {' '.join(imported)}")
    total = sum(self_us for self_us, _, _ in load["imports"])
    print(f"  import time (-X importtime, all imports): {total / 1000:.1f} ms; the largest by their own time:")
    for self_us, cumulative, name in sorted(load["imports"], reverse=True)[:12]:
        print(f"    {self_us / 1000:6.2f} ms  (with its imports {cumulative / 1000:6.2f} ms)  {name.strip()}")
    growth = (stages[-1][1] - base[1]) / 2**20
    record("handler.py", "the handler's load: RSS growth / modules after 36 new-shape submissions",
           f"+{growth:.1f} MiB / {len(imported)} modules")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "per_call_us": {kind: list(q) for kind, q in figures.items()},
            "rss_growth_mib": {n: (r - base[1]) / 2**20 for n, r, _ in stages},
            "traced_mib": dict((n, t / 2**20) for n, t in load["traced"]),
            "modules": imported, "import_ms": total / 1000}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

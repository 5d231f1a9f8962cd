#!/usr/bin/env python3
"""Benchmark: the launcher's REST interface against what a user does by hand, in one run on a
private sandbox:

  submit   POST /v1/jobs (a held 1-node job) vs. `sbatch --hold --wrap true` as the user
  status   GET /v1/jobs/{id} vs. `squeue -j ID` as the user
  burst    N submissions at once through the API (8 clients) vs. N sbatch at once (8 at a time)

Rounds are interleaved (api, direct, api, ...) so drift hits both alike; medians and quartiles
per call, the ratios, and the burst's jobs per second are printed. The API does more than sbatch
by design (a record, the job's tree made by the user through sudo, the batch script): the ratio is
the price of that. Run as root: /opt/tether/venv/bin/python bench/launcher.py
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import threading
import time

from tether.sandbox.cluster import Sandbox
from tether.system.proc import run_command

from steps import ROOT, arguments

SERVICE = "tether-launcher"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("launcher", timeout=120)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def call(conn: UnixHTTPConnection, method: str, path: str, body=None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    response = conn.getresponse()
    raw = response.read()
    try:
        return response.status, json.loads(raw or b"null")
    except ValueError:
        raise SystemExit(f"{method} {path}: {response.status} {raw[:500]!r}") from None


def quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"median {statistics.median(values):7.1f} ms (quartiles {q[0]:.1f}-{q[2]:.1f})"


def main() -> int:
    args = arguments(__doc__, rounds=20)
    box = Sandbox(ROOT)
    box.up(install=False, log=lambda m: None)
    env = {"SLURM_CONF": str(box.slurm_conf), "TETHER_CONFIG": str(box.tether_conf), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    server = subprocess.Popen(["runuser", "-u", SERVICE, "--", "env", *(f"{k}={v}" for k, v in env.items()),
                               "/opt/tether/venv/bin/tether", "serve"], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    user_env = {**box.command_env()}
    spec = {"user": box.user, "job_type": "cmd", "command": ["true"], "slurm": {"sbatch_args": ["--hold", "--time=5"]}}
    times: dict[str, list[float]] = {"api submit": [], "sbatch": [], "api status": [], "squeue": []}
    api_jobs: list[str] = []
    direct_jobs: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:                    # until the service answers (an old socket file may be there)
            try:
                conn = UnixHTTPConnection(str(box.launcher_socket))
                call(conn, "GET", "/v1/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            status, record = call(conn, "POST", "/v1/jobs", spec)
            times["api submit"].append((time.perf_counter() - t0) * 1000)
            assert status == 201, record
            api_jobs.append(record["id"])
            t0 = time.perf_counter()
            job = run_command(["runuser", "-u", box.user, "--", "sbatch", "--parsable", "--hold", "--time=5", "--wrap",
                               "true"], env=user_env, cwd="/tmp").stdout.strip()
            times["sbatch"].append((time.perf_counter() - t0) * 1000)
            direct_jobs.append(job)
            t0 = time.perf_counter()
            call(conn, "GET", f"/v1/jobs/{record['id']}")
            times["api status"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            run_command(["runuser", "-u", box.user, "--", "squeue", "-h", "-j", job, "-o", "%T"], env=user_env)
            times["squeue"].append((time.perf_counter() - t0) * 1000)
        burst = {}
        for kind in ("api", "sbatch"):
            count, done, lock = 40, [], threading.Lock()

            def worker(n: int) -> None:
                local = UnixHTTPConnection(str(box.launcher_socket))
                for _ in range(n):
                    if kind == "api":
                        s, r = call(local, "POST", "/v1/jobs", spec)
                        with lock:
                            done.append(r["id"])
                    else:
                        j = run_command(["runuser", "-u", box.user, "--", "sbatch", "--parsable", "--hold",
                                         "--time=5", "--wrap", "true"], env=user_env, cwd="/tmp").stdout.strip()
                        with lock:
                            done.append(j)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=worker, args=(count // 8,)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            burst[kind] = count / (time.perf_counter() - t0)
            (api_jobs if kind == "api" else direct_jobs).extend(done)
    finally:
        try:
            conn = UnixHTTPConnection(str(box.launcher_socket))
            for job in api_jobs:
                call(conn, "DELETE", f"/v1/jobs/{job}")
        except OSError:
            pass
        if direct_jobs:
            run_command(["scancel", *direct_jobs], env=box.command_env(), check=False)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        if not args.keep:
            box.down(purge=True, log=lambda m: None)
    print(f"launcher REST API vs. the user's own commands, {args.rounds} interleaved rounds (per call)")
    for kind, values in times.items():
        print(f"  {kind:<11} {quartiles(values)}")
    print(f"  submit ratio api/sbatch: {statistics.median(times['api submit']) / statistics.median(times['sbatch']):.2f}")
    print(f"  status ratio api/squeue: {statistics.median(times['api status']) / statistics.median(times['squeue']):.2f}")
    print(f"  burst of 40 submissions, 8 at a time: api {burst['api']:.1f} jobs/s, sbatch {burst['sbatch']:.1f} jobs/s "
          f"(ratio {burst['api'] / burst['sbatch']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

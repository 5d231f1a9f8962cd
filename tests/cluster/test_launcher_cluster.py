"""The launcher (issue 17) on the real cluster, through its REST interface with a real HTTP client
(curl over the unix socket): ``tether serve`` runs as the service account ``tether-launcher``,
submits as the job user through sudo (the policy ``tether launcher install --apply`` wrote), and
the jobs run on the sandbox's Slurm."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import wait_until

pytestmark = pytest.mark.cluster

SERVICE = "tether-launcher"


class Service:
    """``tether serve`` as the service account; requests with curl."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.socket = cluster.box.launcher_socket
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = cluster_env(self.cluster)
        # where the sandbox's Slurm is (in its root, on another release)
        argv = ["runuser", "-u", SERVICE, "--", "env", *(f"{k}={v}" for k, v in env.items()),
                *self.cluster.box.tether, "serve"]
        self.proc = subprocess.Popen(self.cluster.box.wrap(argv, "/"), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd="/")
        assert wait_until(lambda: self.request("GET", "/v1/health", check=False)[0] == 200, timeout=30), \
            self.proc.stderr.read().decode() if self.proc.poll() is not None else "no answer"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)          # runuser and the service: its own session
            self.proc.wait(timeout=30)

    def request(self, method: str, path: str, body=None, *, check: bool = True) -> tuple[int, object]:
        argv = ["curl", "-s", "--max-time", "120", "--unix-socket", str(self.socket), "-X", method,
                "-w", "\n%{http_code}", f"http://launcher{path}"]
        data = None
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
            data = body if isinstance(body, str) else json.dumps(body)
        done = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=150)
        text, _, code = done.stdout.rpartition("\n")
        status = int(code) if code.isdigit() else 0
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = text
        if check:
            assert 200 <= status < 300, (method, path, status, answer, done.stderr)
        return status, answer


def cluster_env(cluster) -> dict[str, str]:
    return {"SLURM_CONF": str(cluster.box.slurm_conf), "TETHER_CONFIG": str(cluster.box.tether_conf),
            "PATH": "/usr/local/bin:/usr/bin:/bin"}


@pytest.fixture(scope="module")
def service(cluster):
    state = cluster.box.root / "launcher-state"       # as on a fresh machine: no records, no lock directory
    for entry in state.iterdir():
        subprocess.run(["rm", "-rf", str(entry)], check=True)
    svc = Service(cluster)
    svc.start()
    yield svc
    svc.stop()


def spec(cluster, **extra) -> dict:
    return {"user": cluster.user, "job_type": "exp", "slurm": {"sbatch_args": ["--time=5"]}, **extra}


def follow(service, job: str, timeout: float = 240) -> tuple[list[str], dict]:
    """Poll the job's status until it ends: the states seen (in order, without repeats), the last record."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, record = service.request("GET", f"/v1/jobs/{job}")
        if not seen or seen[-1] != record["state"]:
            seen.append(record["state"])
        if record["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN"):
            return seen, record
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not end within {timeout} s: {seen}")


def test_a_containerized_three_node_job_through_the_api(cluster, service, registry_image):
    locks = cluster.box.root / "launcher-state" / ".locks"
    status, record = service.request("POST", "/v1/jobs", spec(
        cluster, slots_per_trial=3, slot_type="cpu", slurm={"slots_per_node": 1, "sbatch_args": ["--time=5"]},
        image=registry_image, command=["sh", "-c", "sleep 2; echo node $SLURMD_NODENAME sees $(cat input.txt) $GREETING"],
        environment={"GREETING": "hello from the launcher"}, files={"input.txt": "the staged file"}))
    assert status == 201 and record["state"] == "PENDING", record
    assert oct(locks.stat().st_mode & 0o777) == "0o700"           # the socket's umask is not the service's
    tree = Path(record["tree"])
    assert tree.stat().st_uid == pwd.getpwnam(cluster.user).pw_uid            # the user's, not the service's
    shown = cluster.run(["scontrol", "-o", "show", "job", record["job_id"]]).stdout
    assert f"Command={tree}/job.sh" in shown and f"StdOut={tree}/job.out" in shown and f"StdErr={tree}/job.err" in shown
    assert f"UserId={cluster.user}(" in shown and f"JobName=tether_exp-{record['id']}" in shown
    seen, final = follow(service, record["id"])
    err = tree / "job.err"
    assert seen[-1] == "COMPLETED" and "RUNNING" in seen, (seen, err.read_text(errors="replace")[-3000:]
                                                           if err.exists() else "no job.err")
    assert final["exit_code"] == 0 and final["tree_removed"] and not tree.exists()
    _, logs = service.request("GET", f"/v1/jobs/{record['id']}/logs")
    lines = sorted(line for line in logs["out"].splitlines() if line.startswith("node "))
    assert lines == [f"node {n} sees the staged file hello from the launcher" for n in cluster.nodes], logs
    assert logs["startup_failure"] is None
    assert service.request("DELETE", f"/v1/jobs/{record['id']}")[0] == 200
    assert service.request("GET", f"/v1/jobs/{record['id']}", check=False)[0] == 404


def test_cancel_a_running_job_and_a_broken_image_shows_the_startup_failure(cluster, service):
    _, running = service.request("POST", "/v1/jobs", spec(cluster, command=["sleep", "300"]))
    assert wait_until(lambda: service.request("GET", f"/v1/jobs/{running['id']}")[1]["state"] == "RUNNING",
                      timeout=120)
    _, cancelled = service.request("POST", f"/v1/jobs/{running['id']}/cancel")
    assert wait_until(lambda: service.request("GET", f"/v1/jobs/{running['id']}")[1]["state"] == "CANCELLED",
                      timeout=60)
    assert not Path(running["tree"]).exists()
    _, broken = service.request("POST", "/v1/jobs", spec(cluster, image="/no/such/image", command=["true"]))
    seen, final = follow(service, broken["id"])
    assert final["state"] == "FAILED" and final["exit_code"] == 125, final
    assert "tether: --container-image=/no/such/image: no such file or directory on this node" in \
        final["startup_failure"], final
    _, logs = service.request("GET", f"/v1/jobs/{broken['id']}/logs")
    assert logs["startup_failure"] == final["startup_failure"]
    for job in (running["id"], broken["id"]):
        service.request("DELETE", f"/v1/jobs/{job}")


def test_a_user_the_policy_does_not_allow_is_refused_and_nothing_is_written(cluster, service):
    """Issue 39 finding 4: a spec naming the service account itself was accepted (201) and its job
    ran as tether-launcher, which owns every record. The service refuses it, root and anyone outside
    tether-users (nobody) itself, before anything is written or sudo is asked."""
    before = sorted(os.listdir(cluster.box.root / "jobs" / "launcher"))
    records = service.request("GET", "/v1/jobs")[1]
    for user, why in ((SERVICE, f"the launcher never acts as its own service account ({SERVICE})"),
                      ("nobody", "the launcher acts only for members of the group tether-users: nobody is not one"),
                      ("root", "the launcher never acts for root")):
        status, answer = service.request("POST", "/v1/jobs", {"user": user, "command": ["id", "-un"]}, check=False)
        assert status == 403 and why in answer["error"], answer
    status, answer = service.request("POST", "/v1/jobs", '{"user": "x", ', check=False)
    assert status == 400 and "malformed JSON" in answer["error"]
    assert sorted(os.listdir(cluster.box.root / "jobs" / "launcher")) == before
    assert service.request("GET", "/v1/jobs")[1] == records
    queued = cluster.run(["squeue", "-h", "-u", SERVICE, "-o", "%i"], check=False).stdout.split()
    assert queued == [], queued


def test_fifty_concurrent_submissions_and_a_killed_service_lose_nothing(cluster, service):
    """50 submissions at once: 50 jobs, 50 trees, 50 records. Then the service is killed (SIGKILL)
    while another 20 come in: every submission it acknowledged (201) has its record and its job
    after a restart, and nothing is recorded twice."""
    held = spec(cluster, command=["true"], slurm={"sbatch_args": ["--hold", "--time=5"]})
    answers: list[tuple[int, object]] = []

    def submit():
        while True:          # as a client should: a busy service (503) is asked again after Retry-After
            status, answer = service.request("POST", "/v1/jobs", held, check=False)
            if status != 503:
                break
            time.sleep(1)
        answers.append((status, answer))

    threads = [threading.Thread(target=submit) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in answers].count(201) == 50, [a for s, a in answers if s != 201][:3]
    first = {a["id"]: a["job_id"] for _, a in answers}
    assert len(first) == 50 and len(set(first.values())) == 50
    answers.clear()
    threads = [threading.Thread(target=submit) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    service.stop(signal.SIGKILL)
    for t in threads:
        t.join()
    service.start()
    acknowledged = {a["id"]: a["job_id"] for s, a in answers if s == 201}
    _, records = service.request("GET", "/v1/jobs")
    by_id = {r["id"]: r for r in records}
    for job, slurm_id in {**first, **acknowledged}.items():
        assert by_id[job]["job_id"] == slurm_id, by_id.get(job)
    ids = [r["job_id"] for r in records if r["job_id"]]
    assert len(ids) == len(set(ids))
    queued = cluster.run(["squeue", "-h", "-u", cluster.user, "-o", "%j %i"]).stdout.split("\n")
    mine = {line.split()[0][len("tether_exp-"):]: line.split()[1] for line in queued if line.startswith("tether_exp-")}
    for job in records:                      # every job Slurm has is recorded (a PREPARING one is adopted)
        status = service.request("GET", f"/v1/jobs/{job['id']}")[1]
        if job["id"] in mine:
            assert status["job_id"] == mine[job["id"]]
    assert set(mine) <= set(by_id), set(mine) - set(by_id)
    for job in by_id:
        service.request("DELETE", f"/v1/jobs/{job}")
    assert service.request("GET", "/v1/jobs")[1] == []
    assert not os.listdir(cluster.box.root / "jobs" / "launcher")
    assert wait_until(lambda: not [l for l in cluster.run(["squeue", "-h", "-u", cluster.user, "-o", "%j"]).stdout.split()
                                   if l.startswith("tether_exp-")], timeout=60)

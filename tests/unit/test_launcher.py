"""The launcher (issue 17) without a cluster: the job spec, the agent's file handling (as an
unprivileged user, against symlinks and foreign trees), the state model, the service's records
(crash in the middle, concurrent submissions) and the REST interface, with fake scheduler
commands on PATH. The same flows on the real cluster: tests/cluster/test_launcher_cluster.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tether.hooks.configfile import load_config
from tether.hooks.errors import RequestError
from tether.launcher import agent
from tether.launcher.jobspec import parse_launch_spec
from tether.launcher.service import Launcher, LauncherError, check_id, new_id
from tether.launcher.states import pbs_job_state, slurm_job_state

SPEC = {"user": "nobody", "job_type": "exp", "slots_per_trial": 2, "slot_type": "cpu",
        "slurm": {"slots_per_node": 1}, "command": ["python", "train.py"],
        "environment": {"SECRET": "s3cr3t value"}, "files": {"train.py": "print(1)\n", "conf/a.yaml": "a: 1\n"}}


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.fixture
def world(public_dir):
    """A job root as `tether launcher install` makes it, a state root, a config, fake sbatch/squeue/
    sacct/scancel on PATH that answer from files the test writes."""
    tmp_path = public_dir
    root = tmp_path / "launcher"
    root.mkdir()
    os.chown(root, 0, 0)
    os.chmod(root, 0o1777)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "next_id").write_text("100")
    _fake(bin_dir, "sbatch", f'test "$1" = --parsable || exit 2\nexec 9>{answers}/lock; flock 9\n'
                             f'id=$(cat {answers}/next_id)\n'
                             f'echo $((id + 1)) > {answers}/next_id\ncp "$2" {answers}/script-$id\necho "$id"\n')
    _fake(bin_dir, "squeue", f'cat {answers}/squeue-"$3" 2>/dev/null; exit 0\n')
    _fake(bin_dir, "sacct", f'cat {answers}/sacct-"$5" 2>/dev/null; exit 0\n')
    _fake(bin_dir, "scontrol", "exit 1\n")
    _fake(bin_dir, "scancel", f'echo "CANCELLED by 65534|0:15" > {answers}/sacct-"$1"; rm -f {answers}/squeue-"$1"\n')
    config = tmp_path / "tether.yaml"
    config.write_text(json.dumps({"job_storage_root": str(tmp_path), "launcher": {
        "state_root": str(tmp_path / "state"), "agent": "/nonexistent/agent", "users_group": "nogroup"}}))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    def runner(user, request):                 # the agent in-process (the cluster test runs it through sudo)
        try:
            return agent.handle(json.loads(json.dumps(request)))
        except agent.AgentError as exc:
            return {"error": str(exc)}

    class World:
        pass

    w = World()
    w.tmp, w.root, w.answers, w.env = tmp_path, root, answers, env
    w.launcher = Launcher(load_config(str(config)), env=env, runner=runner, allow_root=True)
    return w


# ---- the job spec -------------------------------------------------------------------------------
@pytest.mark.parametrize("scheduler,args,said", [
    ("slurm", ["--wait"], "--wait makes sbatch wait for the job's end"),
    ("slurm", ["-W", "--time=5"], "-W makes sbatch wait for the job's end"),
    ("slurm", ["--test-only"], "--test-only submits nothing"),
    ("slurm", ["--wrap=sleep 9"], "replaces the job's script"),
    ("pbs", ["-W", "block=true"], "-W block=true makes qsub wait for the job's end"),
    ("pbs", ["-W", "depend=afterok:1,block=TRUE"], "makes qsub wait"),
    ("pbs", ["-I"], "-I is an interactive job"),
])
def test_a_spec_that_would_make_the_service_wait_for_the_job_is_refused(scheduler, args, said):
    """One user's `sbatch_args: [--wait]` made the agent's sbatch wait for the job's end, and with it
    a worker of the service: a few such requests stalled every user's status, logs and cancels
    (issue 39's review). Refused with the reason, before anything is written."""
    key = "sbatch_args" if scheduler == "slurm" else "pbsbatch_args"
    with pytest.raises(RequestError, match=said):
        parse_launch_spec({**SPEC, scheduler: {key: args}}, scheduler)
    ok = ["--time=5"] if scheduler == "slurm" else ["-W", "depend=afterok:1"]
    assert parse_launch_spec({**SPEC, scheduler: {key: ok}}, scheduler).user == SPEC["user"]


def test_the_job_spec_is_checked_whole_before_anything_is_written():
    spec = parse_launch_spec(SPEC, "slurm")
    assert spec.user == "nobody" and spec.command == ("python", "train.py") and spec.request.slots == 2
    with pytest.raises(RequestError) as exc:
        parse_launch_spec({"files": {"../x": "", ".hidden": ""}, "container": {"writable": True},
                           "slots_per_trial": -1}, "slurm")
    text = str(exc.value)
    for part in ("files.../x", "files..hidden", "slots_per_trial", ):
        assert part in text, text
    with pytest.raises(RequestError, match="user: is required"):
        parse_launch_spec({"command": ["true"]}, "slurm")
    with pytest.raises(RequestError, match="container: options need an image"):
        parse_launch_spec({"user": "u", "command": ["true"], "container": {"writable": True}}, "slurm")
    with pytest.raises(RequestError, match="not a valid option"):
        parse_launch_spec({"user": "u", "command": ["true"], "image": "/i", "container": {"bogus": "1"}}, "slurm")
    with_image = parse_launch_spec({"user": "u", "command": ["true"], "image": "busybox:1", "runtime": "podman",
                                    "container": {"writable": True, "mounts": "/d:/d:ro", "remap-root": False}},
                                   "slurm")
    assert with_image.container == {"container-image": "busybox:1", "container-runtime": "podman",
                                    "container-writable": "1", "container-mounts": "/d:/d:ro"}


def test_ids_are_unique_and_paths_never_come_from_them():
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(check_id(i) for i in ids)
    for bad in ("../../etc/passwd", "a/b", "x" * 65, "", "ABC12345"):
        with pytest.raises(LauncherError) as exc:
            check_id(bad)
        assert exc.value.status == 404


# ---- the agent, as an unprivileged user -----------------------------------------------------------
def _agent_as(uid: int, request: dict) -> tuple[int, dict]:
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    done = subprocess.run([sys.executable, "-m", "tether.launcher.agent"], input=json.dumps(request),
                          capture_output=True, text=True, preexec_fn=drop, timeout=60)
    return done.returncode, json.loads(done.stdout)


def test_the_agent_makes_the_tree_as_the_user_and_refuses_what_is_not_theirs(world):
    job = new_id()
    request = {"op": "prepare", "job_root": str(world.root), "id": job, "script": "#!/bin/sh\ntrue\n",
               "files": {"train.py": "x\n", "conf/a.yaml": "a\n"}, "spec": {"user": "nobody"}}
    code, answer = _agent_as(65534, request)
    assert code == 0, answer
    tree = world.root / job
    assert tree.stat().st_uid == 65534 and stat.S_IMODE(tree.stat().st_mode) == 0o700
    assert (tree / "files/conf/a.yaml").read_text() == "a\n"
    assert stat.S_IMODE((tree / "job.sh").stat().st_mode) == 0o700
    assert _agent_as(65534, request) == (1, {"error": f"{world.root}/{job} exists already"})
    # another user's tree: no logs, no removal
    assert _agent_as(1, {"op": "logs", "job_root": str(world.root), "id": job})[1] == {
        "error": f"{world.root}/{job}: Permission denied"}
    assert _agent_as(1, {"op": "remove", "job_root": str(world.root), "id": job}) == (0, {
        "removed": False, "left": f"{world.root}/{job}: Permission denied (not this user's tree)"})
    os.chmod(tree, 0o755)                          # even where they could read it: not theirs, left alone
    assert _agent_as(1, {"op": "remove", "job_root": str(world.root), "id": job}) == (0, {
        "removed": False, "left": f"{world.root}/{job} is not yours (uid 65534's)"})
    assert tree.exists() and (tree / "files/conf/a.yaml").exists()
    # a symlink planted where a tree would be made is never followed
    victim = world.tmp / "victim"
    victim.mkdir()
    other = new_id()
    os.symlink(victim, world.root / other)
    code, answer = _agent_as(65534, {**request, "id": other})
    assert code == 1 and "exists already" in answer["error"] and not list(victim.iterdir())
    code, answer = _agent_as(65534, {"op": "logs", "job_root": str(world.root), "id": other})
    assert code == 1 and answer["error"].endswith(": Not a directory")      # O_NOFOLLOW | O_DIRECTORY
    # a job root that is not root's 1777 is refused
    os.chmod(world.root, 0o777)
    code, answer = _agent_as(65534, {**request, "id": new_id()})
    assert code == 1 and "must be root's with mode 1777" in answer["error"]
    os.chmod(world.root, 0o1777)
    assert _agent_as(65534, {"op": "remove", "job_root": str(world.root), "id": job}) == (0, {"removed": True})
    assert not tree.exists()
    # nothing but one JSON request on stdin
    done = subprocess.run([sys.executable, "-m", "tether.launcher.agent", "prepare"], capture_output=True, text=True)
    assert done.returncode == 2 and "takes no arguments" in done.stderr
    assert _agent_as(65534, {"op": "shell", "job_root": "/"})[1]["error"].startswith("unknown request")
    assert _agent_as(65534, {"op": "prepare", "job_root": str(world.root), "id": "../x", "script": ""})[1] == {
        "error": "bad launcher job id '../x'"}


# ---- the state model --------------------------------------------------------------------------------
def test_slurm_and_pbs_states_map_onto_one_model(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    _fake(bin_dir, "squeue", 'echo "PENDING|Resources"\n')
    assert slurm_job_state("5", env) == slurm_job_state("5", env).__class__("PENDING", None, "Resources")
    _fake(bin_dir, "squeue", "exit 1\n")
    for line, expected in (("COMPLETED|0:0", ("COMPLETED", 0)), ("FAILED|125:0", ("FAILED", 125)),
                           ("CANCELLED by 1001|0:15", ("CANCELLED", 143)), ("TIMEOUT|0:15", ("TIMEOUT", 143)),
                           ("OUT_OF_MEMORY|0:125", ("FAILED", 253)), ("NODE_FAIL|1:0", ("FAILED", 1))):
        _fake(bin_dir, "sacct", f'echo "{line}"\n')
        state = slurm_job_state("5", env)
        assert (state.state, state.exit_code) == expected, line
    _fake(bin_dir, "sacct", "exit 0\n")
    _fake(bin_dir, "scontrol", "exit 1\n")
    assert slurm_job_state("5", env).state == "UNKNOWN"
    for letter, status, expected in (("Q", None, "PENDING"), ("R", None, "RUNNING"), ("F", 0, "COMPLETED"),
                                     ("F", 271, "CANCELLED"), ("F", -29, "TIMEOUT"), ("F", 3, "FAILED")):
        job = {"job_state": letter, **({"Exit_status": status} if status is not None else {})}
        _fake(bin_dir, "qstat", f"cat <<'EOF'\n{json.dumps({'Jobs': {'7.server': job}})}\nEOF\n")
        assert pbs_job_state("7.server", env).state == expected, (letter, status)


# ---- the service --------------------------------------------------------------------------------
def test_a_job_goes_from_submit_to_its_end_and_its_tree_goes_with_it(world):
    launcher = world.launcher
    record = launcher.submit(SPEC)
    assert record["state"] == "PENDING" and record["job_id"] == "100" and record["phase"] == "submitted"
    assert record["job_name"] == f"tether_exp-{record['id']}"
    assert "s3cr3t" not in json.dumps(launcher.list())              # values stay in the user's script
    script = (world.answers / "script-100").read_text()
    assert f"#SBATCH --job-name=tether_exp-{record['id']}" in script and "#SBATCH --no-requeue" in script
    assert f"#SBATCH --output={record['tree']}/job.out" in script and "export SECRET='s3cr3t value'" in script
    (world.answers / "squeue-100").write_text("RUNNING|None\n")
    assert launcher.status(record["id"])["state"] == "RUNNING"
    Path(record["tree"], "job.out").write_text("hello\n")
    assert launcher.logs(record["id"])["out"] == "hello\n"
    (world.answers / "squeue-100").unlink()
    (world.answers / "sacct-100").write_text("COMPLETED|0:0\n")
    done = launcher.status(record["id"])
    assert done["state"] == "COMPLETED" and done["tree_removed"] and not Path(record["tree"]).exists()
    assert launcher.logs(record["id"]) == {"id": record["id"], "state": "COMPLETED", "out": "hello\n", "err": None,
                                           "startup_failure": None, "kept": True}
    assert launcher.cleanup(record["id"]) == {"id": record["id"], "removed": True}
    assert launcher.list() == []
    with pytest.raises(LauncherError) as exc:
        launcher.status(record["id"])
    assert exc.value.status == 404


def test_a_startup_failure_shows_the_end_of_the_error_log(world):
    record = world.launcher.submit(SPEC)
    Path(record["tree"], "job.err").write_text("".join(f"line {i}\n" for i in range(100)) +
                                               "tether: --container-image=/no/such: no such file\n")
    (world.answers / f"sacct-{record['job_id']}").write_text("FAILED|125:0\n")
    done = world.launcher.status(record["id"])
    excerpt = done["startup_failure"].splitlines()
    assert len(excerpt) == 40 and excerpt[-1] == "tether: --container-image=/no/such: no such file"


def test_cancel_and_a_refused_submission(world):
    record = world.launcher.submit(SPEC)
    (world.answers / f"squeue-{record['job_id']}").write_text("RUNNING|None\n")
    assert world.launcher.cancel(record["id"])["state"] == "CANCELLED"
    before = sorted(os.listdir(world.root))
    with pytest.raises(LauncherError, match="slots_per_trial"):
        world.launcher.submit({**SPEC, "slots_per_trial": "many"})
    with pytest.raises(LauncherError, match="names its jobs itself"):
        world.launcher.submit({**SPEC, "job_id": "mine"})
    _fake(Path(world.env["PATH"].split(":")[0]), "sbatch", 'echo "sbatch: error: invalid partition" >&2; exit 1\n')
    with pytest.raises(LauncherError, match="sbatch refused the job: sbatch: error: invalid partition"):
        world.launcher.submit(SPEC)
    assert sorted(os.listdir(world.root)) == before                # nothing left of the refused ones
    assert [r["id"] for r in world.launcher.list()] == [record["id"]]


def test_the_agent_says_which_scheduler_command_it_could_not_run(tmp_path):
    """The agent runs sbatch/qsub/scancel/qdel through system.proc.run_command (issue 42): a command
    that is missing or not executable is an AgentError naming it (a non-executable qsub escaped as a
    PermissionError before)."""
    unusable = tmp_path / "qsub"
    unusable.write_text("#!/bin/sh\necho 1.server\n")              # no x bit
    for argv, why in ((["/nonexistent/qdel", "1.server"], "command not found: /nonexistent/qdel"),
                      ([str(unusable), "job.sh"], f"cannot execute {unusable}: .*Permission denied")):
        with pytest.raises(agent.AgentError, match=f"^cannot run {argv[0]} on this host: {why}"):
            agent._run(argv, {"env": {"PATH": "/usr/bin:/bin"}})
    with pytest.raises(agent.AgentError, match=f"^cannot run {unusable} on this host: working directory "
                                               f"{tmp_path}/gone does not exist$"):
        agent._run([str(unusable), "job.sh"], {"env": {"PATH": "/usr/bin:/bin"}}, cwd=str(tmp_path / "gone"))
    unusable.chmod(0o755)
    done = agent._run([str(unusable), "job.sh"], {"env": {"PATH": "/usr/bin:/bin"}}, cwd=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "1.server\n")


def test_a_crash_between_submit_and_record_loses_nothing(world):
    """The record says PREPARING before sbatch runs; a service killed right after sbatch answered
    leaves it so, and the next look finds the job by its name."""
    launcher = world.launcher
    real = launcher.runner

    def dies_after_submit(user, request):
        answer = real(user, request)
        if request.get("submit"):
            raise SystemExit("killed")                           # as kill -9 would, after sbatch
        return answer

    launcher.runner = dies_after_submit
    with pytest.raises(SystemExit):
        launcher.submit(SPEC)
    launcher.runner = real
    (stuck,) = launcher.list()
    assert stuck["state"] == "PREPARING" and stuck["job_id"] is None
    bin_dir = Path(world.env["PATH"].split(":")[0])
    _fake(bin_dir, "squeue", f'case "$*" in *"-n {stuck["job_name"]}"*) echo 100;; *) exit 0;; esac\n')
    assert launcher.status(stuck["id"])["job_id"] == "100"


def test_concurrent_submissions_each_get_one_record_and_one_tree(world):
    results, errors = [], []

    def one():
        try:
            results.append(world.launcher.submit(SPEC)["id"])
        except Exception as exc:                                     # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 20
    assert sorted(r["id"] for r in world.launcher.list()) == sorted(results)
    assert len(os.listdir(world.root)) == 20
    assert sorted(r["job_id"] for r in world.launcher.list()) == [str(100 + i) for i in range(20)]


def test_the_service_refuses_to_run_as_root_and_to_act_for_root(world):
    config = load_config(str(world.tmp / "tether.yaml"))
    with pytest.raises(LauncherError, match="does not run as root"):
        Launcher(config)
    launcher = Launcher(config, env=world.env, allow_root=True)
    with pytest.raises(LauncherError, match="never acts for root"):
        launcher.submit({**SPEC, "user": "root"})
    with pytest.raises(LauncherError, match="no user 'nosuchuser'"):
        launcher.submit({**SPEC, "user": "nosuchuser"})


# ---- the REST interface -------------------------------------------------------------------------
def test_the_rest_interface_answers_4xx_and_writes_nothing_for_bad_input(world):
    import asyncio                       # aiohttp: the rest extra, which tests/bootstrap installs

    from aiohttp.test_utils import TestClient, TestServer

    from tether.launcher.rest import OPENAPI, make_app

    async def scenario():
        app = make_app(world.launcher)
        routes = {(r.method, r.resource.canonical) for r in app.router.routes()}
        documented = {(m.upper(), p) for p, ops in OPENAPI["paths"].items() for m in ops}
        assert routes == documented                                  # the document is the implementation
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/v1/health")).status == 200
            r = await client.post("/v1/jobs", data="{bad", headers={"Content-Type": "application/json"})
            assert r.status == 400 and "malformed JSON" in (await r.json())["error"]
            r = await client.post("/v1/jobs", json={**SPEC, "unknown": 1})
            assert r.status == 400 and "unknown: unknown key" in (await r.json())["error"]
            r = await client.post("/v1/jobs", data=b"x" * (33 << 20), headers={"Content-Type": "application/json"})
            assert r.status == 413
            r = await client.get("/v1/jobs/..%2f..%2fetc%2fpasswd")
            assert r.status == 404
            assert world.launcher.list() == [] and os.listdir(world.root) == []
            (world.answers / "squeue-100").write_text("PENDING|Priority\n")
            r = await client.post("/v1/jobs", json=SPEC)
            assert r.status == 201
            job = (await r.json())["id"]
            assert (await (await client.get(f"/v1/jobs/{job}")).json())["state"] == "PENDING"
            assert (await client.delete(f"/v1/jobs/{job}")).status == 200
            assert (await client.get(f"/v1/jobs/{job}")).status == 404
            assert (await client.get("/openapi.json")).status == 200
        async with TestClient(TestServer(make_app(world.launcher, token="t" * 32))) as client:
            assert (await client.get("/v1/health")).status == 401
            assert (await client.get("/v1/health", headers={"Authorization": "Bearer " + "t" * 32})).status == 200

    asyncio.run(scenario())


def test_launcher_install_prints_a_policy_visudo_accepts(world):
    from tether.launcher.install import plan, sudoers_text

    config = load_config(str(world.tmp / "tether.yaml"))
    text = sudoers_text(config)
    assert 'tether-launcher ALL = (%nogroup) NOPASSWD: /nonexistent/agent ""' in text
    assert any("1777" in line for line in plan(config))
    policy = world.tmp / "policy"
    policy.write_text(text)
    os.chmod(policy, 0o440)
    visudo = subprocess.run(["visudo", "-c", "-f", str(policy)], capture_output=True, text=True)
    assert visudo.returncode == 0, visudo.stdout + visudo.stderr


def test_the_same_flow_on_pbs_through_the_stateful_fakes(world, tmp_path):
    """PBS: qsub as the user runs tether's real submit hook (the fake server); the script has the
    #PBS options tether controls and the per-host pbs_tmrsh fan-out; qstat -f -F json -x drives the state;
    qdel cancels."""
    from tether.testing.pbs import FakePbs

    config_path = world.tmp / "tether.yaml"
    data = json.loads(config_path.read_text())
    data["launcher"]["scheduler"] = "pbs"
    config_path.write_text(json.dumps(data))
    pbs = FakePbs(tmp_path / "pbs", config=config_path)
    env = {"PATH": f"{pbs.bin_dir}:/usr/bin:/bin"}
    launcher = Launcher(load_config(str(config_path)), env=env, runner=world.launcher.runner, allow_root=True)
    record = launcher.submit({**SPEC, "image": "busybox:1", "runtime": "podman"})
    job = pbs.job(record["job_id"])
    assert record["state"] == "PENDING" and job["Job_Name"] == record["job_name"][:236]
    assert job["Resource_List"]["select"] == "2:ncpus=1" and job["workdir"] == f"{record['tree']}/files"
    script = Path(record["tree"], "job.sh").read_text()
    assert f"#PBS -N {record['job_name']}" in script and "#PBS -r n" in script and "#PBS -W umask=0022" in script
    assert "pbs_tmrsh" in script and "--container-image=busybox:1" in script
    with pbs.state.jobs() as table:
        table["jobs"][record["job_id"]]["job_state"] = "R"
    assert launcher.status(record["id"])["state"] == "RUNNING"
    with pbs.state.jobs() as table:
        table["jobs"][record["job_id"]].update(job_state="F", Exit_status=0)
    assert launcher.status(record["id"])["state"] == "COMPLETED" and not Path(record["tree"]).exists()
    queued = launcher.submit(SPEC)
    assert launcher.cancel(queued["id"])["state"] == "CANCELLED"


def test_a_pbs_jobs_variables_reach_every_host_through_its_tree_never_a_command_line(world, tmp_path):
    """The launcher's PBS job run as the scheduler would (the fake OpenPBS: run_job, then the script
    with the job's environment; its strict pbs_tmrsh gives each host's task the job's environment
    only): each host's `tether run` (a stand-in that reads the file as tether run does) gets the
    job's SECRET from the file in the job's tree, which is gone when the script has ended."""
    from tether.testing.pbs import FakePbs

    config_path = world.tmp / "tether.yaml"
    data = json.loads(config_path.read_text())
    data["launcher"]["scheduler"] = "pbs"
    config_path.write_text(json.dumps(data))
    pbs = FakePbs(tmp_path / "pbs", config=config_path)
    out = tmp_path / "hosts"
    out.mkdir()
    fake = tmp_path / "tether"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, os, sys\n"
                    "from tether.container.scripts import read_env_file\n"
                    "path = os.environ['TETHER_RUN_ENV_FILE']\n"
                    "record = {'argv': sys.argv[1:], 'file': path, 'mode': os.stat(path).st_mode & 0o777,\n"
                    "          'secret': read_env_file(path).get('SECRET'), 'inherited': os.environ.get('SECRET')}\n"
                    f"open(os.path.join({str(out)!r}, os.environ['NODE_RANK'] + '.json'), 'w').write(json.dumps(record))\n")
    fake.chmod(0o755)
    launcher = Launcher(load_config(str(config_path)), env={"PATH": f"{pbs.bin_dir}:/usr/bin:/bin"},
                        runner=world.launcher.runner, allow_root=True)
    launcher.tether = str(fake)
    record = launcher.submit({**SPEC, "image": "busybox:1", "runtime": "podman"})
    script = Path(record["tree"], "job.sh").read_text()
    assert "s3cr3t" not in "".join(line for line in script.splitlines() if "pbs_tmrsh" in line)
    job_env = pbs.run_job(record["job_id"])
    ran = subprocess.run(["bash", str(Path(record["tree"], "job.sh"))], env=job_env, cwd=record["tree"],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    hosts = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(hosts) == ["0", "1"]
    env_file = Path(record["tree"], f"{record['job_id']}.env.json")
    for host in hosts.values():
        assert host["secret"] == "s3cr3t value" and host["inherited"] is None      # the file, not the env
        assert host["file"] == str(env_file) and host["mode"] == 0o600
        assert host["argv"][:1] == ["run"] and "--container-image=busybox:1" in host["argv"]
    assert not env_file.exists()


# ---- tether serve on loopback TCP with TLS (a real server process, as an unprivileged user) -------
def _serve_as_nobody(world, *args: str) -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "tether.cli.main",
            "serve", "--config", str(world.tmp / "tether.yaml"), *args]


def test_serve_answers_over_https_with_the_token_and_refuses_bad_arguments_in_one_line(world):
    import socket
    import ssl
    import urllib.error
    import urllib.request

    cert, key, token = world.tmp / "cert.pem", world.tmp / "key.pem", world.tmp / "token"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                           "-out", str(cert)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    token.write_text("s" * 32 + "\n")
    for path, mode in ((cert, 0o644), (key, 0o600), (token, 0o600)):     # the secrets: the service account's
        os.chown(path, 65534, 65534)
        os.chmod(path, mode)
    with socket.socket() as probe:                      # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tcp = f"127.0.0.1:{port}"
    env = {**os.environ, **world.env, "PYTHONDONTWRITEBYTECODE": "1"}
    server = subprocess.Popen(_serve_as_nobody(world, "--tcp", tcp, "--token-file", str(token), "--tls-cert",
                                               str(cert), "--tls-key", str(key)),
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
    try:
        trusting = ssl.create_default_context(cafile=str(cert))

        def health(headers: dict, context=trusting, scheme: str = "https") -> int:
            request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/v1/health", headers=headers)
            try:
                with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as exc:
                return exc.code

        deadline = time.monotonic() + 30
        while True:
            try:
                status = health({"Authorization": "Bearer " + "s" * 32})
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.stderr.read().decode()
                assert time.monotonic() < deadline, "tether serve did not answer within 30 s"
                time.sleep(0.2)
        assert status == 200                                           # TLS verified against its certificate
        assert health({}) == 401 and health({"Authorization": "Bearer wrong-token-wrong"}) == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            health({}, context=ssl.create_default_context())          # an untrusted certificate is not accepted
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            health({}, context=None, scheme="http")                    # no plain HTTP on the TLS port
        # the port is taken now: a second server says so in one line
        taken = subprocess.run(_serve_as_nobody(world, "--tcp", tcp, "--token-file", str(token), "--tls-cert",
                                                str(cert), "--tls-key", str(key)), env=env,
                               capture_output=True, text=True, timeout=60, cwd="/")
        assert taken.returncode == 1 and taken.stderr.strip().startswith(f"tether: cannot listen on {tcp}: "), \
            taken.stderr
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0, server.stderr.read().decode()
    said = server.stderr.read().decode().splitlines()       # its start and each refusal, one line each
    assert said[0] == f"tether: serving the launcher on https://{tcp} (a bearer token, TLS)", said
    assert said.count("tether: refused GET /v1/health: 401 a bearer token is required") == 2, said
    garbage = world.tmp / "garbage.pem"
    garbage.write_text("not a certificate\n")
    os.chmod(garbage, 0o644)
    secret = world.tmp / "secret"
    secret.write_text("s" * 32)
    os.chmod(secret, 0o600)                                            # root's: nobody cannot read it
    for args, words in (
            (["--tls-cert", str(cert), "--tls-key", str(key)], "go with --tcp"),
            (["--tcp", tcp, "--token-file", str(token), "--tls-key", str(key)], "--tls-key needs --tls-cert"),
            (["--tcp", tcp, "--token-file", str(secret), "--tls-cert", str(cert), "--tls-key", str(key)],
             f"cannot read the token file {secret}: Permission denied"),
            (["--tcp", tcp, "--token-file", str(token)], "--tcp needs --tls-cert"),
            (["--tcp", tcp, "--token-file", str(token), "--tls-cert", str(garbage)],
             f"cannot load the TLS certificate {garbage}: "),
            (["--tcp", "0.0.0.0:8080", "--token-file", str(token)], "takes a loopback address")):
        out = subprocess.run(_serve_as_nobody(world, *args), env=env, capture_output=True, text=True, timeout=60,
                             cwd="/")
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and words in out.stderr, (args, out.stderr)


def test_a_cancel_says_it_was_requested_until_the_job_has_ended(capsys):
    """`tether cancel` answered "state: RUNNING" and nothing else: the scheduler ends the job
    a moment later. The record now says the cancel was asked for, until the state is final."""
    from tether.cli.launcher import _show

    record = {"id": "6b06-x", "user": "alice", "job_name": "tether_exp-6b06-x", "job_id": "17", "state": "RUNNING",
              "cancel_requested": 1795600000.0}
    _show(record, False)
    assert "cancel: requested at " in capsys.readouterr().out
    _show({**record, "state": "CANCELLED"}, False)
    out = capsys.readouterr().out
    assert "state: CANCELLED" in out and "cancel:" not in out


# ---- issue 39: the service account, the records' locks, the REST bounds, plain TCP, the CLI ----------
def _as_service(world, user: str = "nobody") -> tuple[Path, Path]:
    """The launcher run for real by an unprivileged service account (``user``, whose own group is
    ``launcher.users_group``): its config and a spec file; the agent the installer writes; a fake
    ``sudo`` that records being asked (the sandbox's real policy: tests/cluster)."""
    from tether.launcher.install import agent_text

    bin_dir = Path(world.env["PATH"].split(":")[0])
    _fake(bin_dir, "sudo", f'echo "$*" >> {world.tmp}/sudo-calls\nexit 1\n')
    agent_path = bin_dir / "tether-agent"
    agent_path.write_text(agent_text())
    agent_path.chmod(0o755)
    entry = _pwd_entry(user)
    state = world.tmp / "service-state"
    state.mkdir()
    os.chown(state, entry.pw_uid, entry.pw_gid)
    state.chmod(0o700)
    for path in [world.answers, *world.answers.iterdir()]:      # the fake sbatch writes here as the service
        os.chown(path, entry.pw_uid, entry.pw_gid)
    config = world.tmp / "service.yaml"
    config.write_text(json.dumps({"job_storage_root": str(world.tmp), "launcher": {
        "state_root": str(state), "agent": str(agent_path), "service_user": user,
        "users_group": _group_name(entry.pw_gid)}}))
    return config, state


def _pwd_entry(user: str):
    import pwd

    return pwd.getpwnam(user)


def _group_name(gid: int) -> str:
    import grp

    return grp.getgrgid(gid).gr_name


def _tether_as(uid: int, *args: str, env: dict | None = None, stdin: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-m",
                           "tether.cli.main", *args], input=stdin, env={**os.environ, **(env or {}),
                                                                         "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=timeout, cwd="/")


def test_the_service_never_acts_as_itself_nor_for_a_user_outside_its_group(world):
    """Issue 39 finding 4: a spec naming the service account ran the job as the service account
    (no sudo: "that is this process's user"), which can read and rewrite every record. Now the
    service refuses it (403) and any user outside ``launcher.users_group`` itself, before anything
    is written and without asking sudo."""
    config, state = _as_service(world)
    for user, words in (("nobody", "never acts as its own service account (nobody)"),
                        ("daemon", "acts only for members of the group nogroup: daemon is not one")):
        spec = world.tmp / f"spec-{user}.json"
        spec.write_text(json.dumps({**SPEC, "user": user}))
        spec.chmod(0o644)
        done = _tether_as(65534, "submit", "--config", str(config), str(spec), env=world.env)
        assert done.returncode == 1 and words in done.stderr, (user, done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.startswith("tether: "), done.stderr
    assert os.listdir(state) == [] and os.listdir(world.root) == []       # no record, no tree
    assert not (world.tmp / "sudo-calls").exists()                       # and sudo was never asked
    assert not list(world.answers.glob("script-*"))                      # nor sbatch


def test_unknown_ids_leave_nothing_and_a_removed_job_leaves_no_lock(world):
    """Issue 39 finding 8a: every request for an id left a lock file, known or not (2000 GETs: 2000
    files). A lock file exists only while its job has a record."""
    launcher = world.launcher
    record = launcher.submit(SPEC)
    locks = Path(launcher.state_root, ".locks")
    for i in range(2000):
        job = new_id()
        with pytest.raises(LauncherError) as exc:
            (launcher.status, launcher.logs, launcher.cancel, launcher.cleanup)[i % 4](job)
        assert exc.value.status == 404, exc.value
    assert set(os.listdir(locks)) <= {record["id"]}
    assert sorted(os.listdir(launcher.state_root)) == [".locks", f"{record['id']}.json"]
    launcher.cleanup(record["id"])
    assert os.listdir(locks) == [] and os.listdir(launcher.state_root) == [".locks"]


def test_the_per_job_lock_still_excludes_while_its_file_comes_and_goes(world):
    """The lock file goes with the record: requests that opened it before it went lock the new one
    (the holder is who locked the file the name still points at). Eight threads take turns
    removing and writing the record; never two inside at once; nothing left when the record is gone."""
    launcher = world.launcher
    record = launcher.submit(SPEC)
    path = Path(launcher.state_root, f"{record['id']}.json")
    text = path.read_text()
    path.unlink()                                      # the first turn writes it, the last removes it
    inside, overlaps, errors, guard = [0], [], [], threading.Lock()

    def turns():
        try:
            take_turns()
        except Exception as exc:                               # noqa: BLE001 -- reported below
            errors.append(exc)

    def take_turns():
        for _ in range(150):
            with launcher._locked(record["id"], new=True):      # as submit takes it: with or without a record
                with guard:
                    inside[0] += 1
                    if inside[0] > 1:
                        overlaps.append(inside[0])
                time.sleep(0)                                  # let the others try the lock
                if path.exists():
                    path.unlink()
                else:
                    path.write_text(text)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=turns) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not overlaps
    assert not path.exists() and os.listdir(Path(launcher.state_root, ".locks")) == []    # 1200 turns: even


def test_a_records_removal_never_needs_its_tree_and_never_touches_another_users(world):
    """Issue 39 finding 8b: once auto-cleanup had removed a finished job's tree, another user could
    make a directory of its name, and the record could no longer be deleted ("... is not yours").
    Also a tree replaced by a symlink while the job ran. The record goes; what is there stays."""
    launcher = world.launcher
    record = launcher.submit(SPEC)
    (world.answers / f"sacct-{record['job_id']}").write_text("COMPLETED|0:0\n")
    assert launcher.status(record["id"])["tree_removed"]
    squat = Path(record["tree"])
    squat.mkdir()
    (squat / "theirs").write_text("mine\n")
    for path in (squat, squat / "theirs"):
        os.chown(path, 1, 1)
    assert launcher.cleanup(record["id"]) == {"id": record["id"], "removed": True}
    assert (squat / "theirs").read_text() == "mine\n" and squat.stat().st_uid == 1
    with pytest.raises(LauncherError):
        launcher.status(record["id"])
    running = launcher.submit(SPEC)
    (world.answers / f"squeue-{running['job_id']}").write_text("RUNNING|None\n")
    subprocess.run(["rm", "-rf", running["tree"]], check=True)
    victim = world.tmp / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep\n")
    os.symlink(victim, running["tree"])
    assert launcher.cleanup(running["id"]) == {"id": running["id"], "removed": True}     # cancelled, then gone
    assert (victim / "keep").read_text() == "keep\n" and os.path.islink(running["tree"])
    assert launcher.list() == []


def _raw(port: int, head: str, body: bytes = b""):
    """One raw HTTP/1.1 request on its own connection (asyncio streams): (reader, writer)."""
    import asyncio

    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        return reader, writer

    return go()


def test_the_rest_interface_bounds_what_it_holds(world):
    """Issue 39 finding 8c: 24 concurrent 12 MiB POSTs took the service from 43 to 677 MB (no cap on
    a body beyond 32 MiB, none on requests at once). A body over ``launcher.max_request_bytes``
    (1 MiB: a spec and its small staged files) is refused with 413 from its Content-Length, before
    a byte of it is read -- these clients never send theirs; at most ``launcher.max_requests`` (32)
    requests are in hand at once and the next gets 503 with Retry-After: the bodies the service holds
    are bounded by 32 x 1 MiB."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from tether.launcher import rest

    async def scenario():
        app = rest.make_app(world.launcher)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            port = client.server.port
            big = [await _raw(port, f"POST /v1/jobs HTTP/1.1\nHost: launcher\nContent-Type: application/json\n"
                                    f"Content-Length: {12 << 20}\n") for _ in range(24)]
            for reader, writer in big:
                status = await asyncio.wait_for(reader.readline(), 30)      # no body was sent: not waited for
                assert status.startswith(b"HTTP/1.1 413"), status
                writer.close()
            held = [await _raw(port, "POST /v1/jobs HTTP/1.1\nHost: launcher\nContent-Type: application/json\n"
                                     "Content-Length: 2\n") for _ in range(32)]
            for _ in range(3000):                                    # each is in the handler, awaiting its body
                if app[rest.IN_FLIGHT].now == 32:
                    break
                await asyncio.sleep(0.01)
            assert app[rest.IN_FLIGHT].now == 32
            refused = await client.get("/v1/health")
            assert refused.status == 503 and refused.headers["Retry-After"] == "1"
            assert "32 requests" in (await refused.json())["error"]
            for reader, writer in held:
                writer.write(b"[]")
                await writer.drain()
                assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"HTTP/1.1 400")
                writer.close()
            for _ in range(3000):
                if app[rest.IN_FLIGHT].now == 0:
                    break
                await asyncio.sleep(0.01)
            assert (await client.get("/v1/health")).status == 200
            async def unsaid_length():
                yield b"{"
                yield b" " * (1 << 20)

            r = await client.post("/v1/jobs", data=unsaid_length(), headers={"Content-Type": "application/json"})
            assert r.status == 413 and "1 MiB" in (await r.json())["error"]      # no length said: cut off at 1 MiB
        assert world.launcher.list() == [] and os.listdir(world.root) == []

    asyncio.run(scenario())


def test_plain_tcp_and_readable_secrets_are_refused_before_anything_listens(world):
    """Issue 39 finding 8d: with --tcp and no TLS, a user who bound the port while the service was
    down received every client's bearer token. --tcp now needs TLS (the clients verify the
    service's certificate: a squatter cannot present it), and the key and the token must be
    readable by the service account alone (or root's, 0640 at most). A unix socket in a directory
    others may write (where they could bind its name first) is refused too."""
    import socket

    cert, key, token = world.tmp / "c.pem", world.tmp / "k.pem", world.tmp / "tok"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    token.write_text("s" * 32 + "\n")
    for path, mode in ((cert, 0o644), (key, 0o600), (token, 0o600)):
        os.chown(path, 65534, 65534)
        path.chmod(mode)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        tcp = f"127.0.0.1:{probe.getsockname()[1]}"
    config = str(world.tmp / "tether.yaml")
    for args, words, fix in (
            (["--tcp", tcp, "--token-file", str(token)], "--tcp needs --tls-cert", None),
            (["--tcp", tcp, "--token-file", str(token), "--tls-cert", str(cert), "--tls-key", str(key)],
             f"the TLS key {key} is readable by others (mode 644)", (key, 0o644)),
            (["--tcp", tcp, "--token-file", str(token), "--tls-cert", str(cert), "--tls-key", str(key)],
             f"the token file {token} is readable by others (mode 640)", (token, 0o640))):
        if fix:
            fix[0].chmod(fix[1])
        try:
            done = _tether_as(65534, "serve", "--config", config, *args, env=world.env, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tether serve {' '.join(args)} listened")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, (args, done.stderr)
        if fix:
            fix[0].chmod(0o600)
    shared = world.tmp / "shared"               # the unix socket likewise: not where others may make its name
    shared.mkdir()
    shared.chmod(0o1777)
    try:
        done = _tether_as(65534, "serve", "--config", config, "--socket", str(shared / "launcher.sock"),
                          env=world.env, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tether serve listened on a socket in {shared}")
    assert done.returncode == 2 and f"the socket's directory {shared} (uid 0, mode 1777) may be written by " \
        "others" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert os.listdir(shared) == []


def test_the_launcher_commands_say_in_one_line_what_is_wrong(world):
    """Issue 39 finding 11: `tether submit` by a user who is not the service account printed a
    traceback (PermissionError on the state directory); so did `list`, `status`, `serve` where its
    socket cannot be made, and a spec file that is not text."""
    state = Path(world.launcher.state_root)
    state.mkdir(mode=0o700)
    spec = world.tmp / "spec.json"
    spec.write_text(json.dumps(SPEC))
    binary = world.tmp / "binary.yaml"
    binary.write_bytes(b"user: \xd0\x00\xff\n")
    for path in (spec, binary):
        path.chmod(0o644)
    config = str(world.tmp / "tether.yaml")
    for args, words in ((["submit", str(spec)], "run as the launcher's service account tether-launcher"),
                        (["list"], "run as the launcher's service account tether-launcher"),
                        (["status", new_id()], "run as the launcher's service account tether-launcher"),
                        (["submit", str(binary)], f"cannot read job spec {binary}: not UTF-8 text"),
                        (["serve", "--socket", "/root/no/launcher.sock"], "cannot make the socket's directory "
                                                                          "/root/no: Permission denied")):
        done = _tether_as(1, *args, "--config", config, env=world.env, timeout=60)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, (args, done.stderr)
        assert done.stderr.startswith("tether: ") and words in done.stderr, (args, done.stderr)

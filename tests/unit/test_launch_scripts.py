"""The per-node launch scripts, generated and executed: bash -n, hostile values, one container per
host, and the first failing host ending the job. pbs_tmrsh is a shell function here (OpenPBS is not
installable); the Slurm script runs as a batch job of the testing kit's fake Slurm (tether.testing). `tether` is a fake that
records what each host's launch received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tether.container.scripts import pbs_launch_script, slurm_launch_script
from tether.container.spec import LaunchError

HOSTILE = {"QUOTES": "it's \"quoted\"", "SUBST": "$(touch /tmp/pwned) `id`", "NEWLINE": "line1\nline2",
           "COMMAS": "a,b\\,c", "EMPTY": ""}
COMMAND = ["python", "train.py", "--name", "it's $(x) `y`", "multi\nline"]
OPTIONS = {"container-image": "docker://registry.local:5000/team/img:1.0", "container-runtime": "podman",
           "container-mounts": "/data:/data:ro", "container-env": "QUOTES,SUBST", "container-writable": "1"}

FAKE_TETHER = textwrap.dedent("""\
    #!{python}
    import json, os, sys, time
    host = os.environ.get("FAKE_HOST") or os.environ.get("SLURMD_NODENAME", "?")
    path = os.path.join(os.environ["FAKE_OUT"], host + ".json")
    env_file = os.environ.get("TETHER_RUN_ENV_FILE")
    with open(path + ".tmp", "w") as fh:                  # whole or not at all: a host may be killed
        json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid(),
                   "env_file": open(env_file).read() if env_file else None,
                   "env_file_mode": os.stat(env_file).st_mode & 0o777 if env_file else None}}, fh)
    os.rename(path + ".tmp", path)
    if host == os.environ.get("FAIL_HOST"):
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    """)

@pytest.fixture
def fakes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out").mkdir()
    (bin_dir / "tether").write_text(FAKE_TETHER.format(python=sys.executable))
    (bin_dir / "tether").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    return bin_dir, tmp_path / "out", env


def _recorded(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _render(kind: str, tether: str) -> str:
    make = pbs_launch_script if kind == "pbs" else slurm_launch_script
    return make(COMMAND, OPTIONS, HOSTILE, tether=tether)


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_scripts_pass_bash_n(tmp_path, kind):
    script = tmp_path / "launch.sh"
    script.write_text(_render(kind, "/opt/tether/venv/bin/tether"))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# pbs_tmrsh as OpenPBS's: the command runs "on" the host with the job's environment, not the
# caller's (tm_spawn(..., NULL, ...)); its argv is recorded, as `ps` on the first host would show it,
# in a file per host (the hosts' calls run at once: appends to one file could interleave)
PBS_TMRSH = ('pbs_tmrsh() {{ local host=$1; shift; printf "%s\\0" "$@" > {argv_log}.$host; '
             'env -i PATH="$PATH" FAKE_OUT="$FAKE_OUT" HOME="$HOME" PBS_JOBID="$PBS_JOBID" ${{FAIL_HOST:+FAIL_HOST=$FAIL_HOST}} '
             '${{FAKE_SLEEP:+FAKE_SLEEP=$FAKE_SLEEP}} FAKE_HOST=$host "$@"; }}\n')


def test_pbs_script_starts_one_container_per_host_with_the_jobs_variables_off_every_command_line(tmp_path, fakes):
    """Every host's launch gets the job's variables exactly, through a file only the user may read
    (named in TETHER_RUN_ENV_FILE, read by `tether run`); no value is on pbs_tmrsh's command line,
    which stays on the first host, readable by every user there, for as long as the job runs."""
    bin_dir, out, env = fakes
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("h1\nh1\nh2\nh2\nh3\n")                 # one line per mpiproc
    script = tmp_path / "launch.sh"
    shared = tmp_path / "tree"
    script.write_text(pbs_launch_script(COMMAND, OPTIONS, {**HOSTILE, "NODE_RANK": "7"},
                                        tether=str(bin_dir / "tether"), env_dir=str(shared)))
    argv_log = tmp_path / "tmrsh-argv"
    runner = PBS_TMRSH.format(argv_log=argv_log) + f'source {script}\n'
    result = subprocess.run(["bash", "-c", runner], env={**env, "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "12.s"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = _recorded(out)
    assert sorted(calls) == ["h1", "h2", "h3"]
    for rank, host in enumerate(["h1", "h2", "h3"]):
        call = calls[host]
        assert call["argv"] == ["run", *[f"--{k}={v}" for k, v in OPTIONS.items() if k != "container-writable"],
                                "--container-writable", "--", *COMMAND]
        assert call["env"]["TETHER_RUN_ENV_FILE"] == str(shared / "12.s.env.json")
        assert json.loads(call["env_file"]) == {**HOSTILE, "NODE_RANK": "7"}      # exact, unexpanded
        assert call["env_file_mode"] == 0o600
        assert (call["env"]["NODE_RANK"], call["env"]["TETHER_NNODES"], call["env"]["MASTER_ADDR"],
                call["env"]["MASTER_PORT"]) == (str(rank), "3", "h1", str(12288 + 12 * 16))
    calls_argv = [p.read_text() for p in sorted(tmp_path.glob(f"{argv_log.name}.*"))]
    assert len(calls_argv) == 3 and all("TETHER_RUN_ENV_FILE=" in a for a in calls_argv)
    for name, value in HOSTILE.items():
        if value:
            assert value not in "".join(calls_argv), name
    assert not (shared / "12.s.env.json").exists()             # gone with the script
    assert shared.stat().st_mode & 0o777 == 0o700
    assert not Path("/tmp/pwned").exists()


def test_a_pbs_script_sent_sigterm_removes_the_variables_and_still_dies_of_the_signal(tmp_path, fakes):
    """qdel of a running job: SIGTERM to the script. The file of the job's variables goes, and the
    script dies of SIGTERM (PBS reports 256+15, which the launcher reads as CANCELLED), not exit 143."""
    import signal

    bin_dir, out, env = fakes
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("h1\nh2\n")
    shared = tmp_path / "tree"
    script = tmp_path / "launch.sh"
    script.write_text(pbs_launch_script(COMMAND, OPTIONS, HOSTILE, tether=str(bin_dir / "tether"), env_dir=str(shared)))
    (bin_dir / "pbs_tmrsh").write_text('#!/bin/sh\nhost=$1; shift; FAKE_HOST=$host exec "$@"\n')
    (bin_dir / "pbs_tmrsh").chmod(0o755)
    proc = subprocess.Popen(["bash", str(script)], env={**env, "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "13.s",
                                                        "FAKE_SLEEP": "60"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(_recorded(out)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(_recorded(out)) == 2, proc.communicate(timeout=30)
        assert (shared / "13.s.env.json").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert not (shared / "13.s.env.json").exists()
    finally:                                   # the hosts' launches (the job's end would kill them)
        proc.kill()
        for call in _recorded(out).values():
            subprocess.run(["kill", str(call["pid"])], capture_output=True)


def test_a_pbs_script_without_variables_writes_no_file(tmp_path, fakes):
    bin_dir, out, env = fakes
    text = pbs_launch_script(["true"], {"container-image": "/i"}, {}, tether=str(bin_dir / "tether"))
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "TETHER_RUN_ENV_FILE" not in code and "env_file" not in code


def test_tether_run_reads_the_jobs_variables_from_the_scripts_file(tmp_path, monkeypatch, capsys):
    """What a host's `tether run` makes of TETHER_RUN_ENV_FILE: the job's variables, the per-host
    ones of the script winning over the job's of the same name; a missing or foreign file: 125."""
    from tether.cli import containers

    seen = {}
    monkeypatch.setattr(containers, "run_container", lambda env, command, settings: seen.update(env=env))
    monkeypatch.setattr(containers, "container_settings", lambda path: {})
    args = type("A", (), {"cmd": ["--", "true"], "config": None,
                          **{o.name.replace("-", "_"): None for o in containers.CONTAINER_OPTIONS}})()
    good = tmp_path / "env.json"
    good.write_text(json.dumps({**HOSTILE, "NODE_RANK": "7", "OTHER": "x"}))
    monkeypatch.setenv("TETHER_RUN_ENV_FILE", str(good))
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("OTHER", "inherited")
    containers.run(args)
    assert {k: seen["env"][k] for k in HOSTILE} == HOSTILE
    assert (seen["env"]["NODE_RANK"], seen["env"]["OTHER"]) == ("1", "x")
    assert "TETHER_RUN_ENV_FILE" not in seen["env"]
    for text, said in (('["A"]', "names to strings"), ('{"BAD-NAME": "x"}', "names to strings"),
                       ('{"A": 1}', "names to strings"), ("{", "not what tether wrote"), (None, "cannot read"),
                       ("FIFO", "not a regular file")):
        seen.clear()
        bad = tmp_path / "bad.json"
        bad.unlink(missing_ok=True)
        if text == "FIFO":                     # refused at once, not waited on
            os.mkfifo(bad)
        elif text is not None:
            bad.write_text(text)
        monkeypatch.setenv("TETHER_RUN_ENV_FILE", str(bad))
        assert containers.run(args) == 125 and not seen
        said = capsys.readouterr().err         # one line, one prefix (it read "tether: tether run: ...")
        assert said.startswith("tether: ") and not said.startswith("tether: tether") and \
            said.count("\n") == 1 and str(bad) in said, said


def test_pbs_script_ends_the_job_when_one_host_fails(tmp_path, fakes):
    bin_dir, out, env = fakes
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("h1\nh2\nh3\n")
    script = tmp_path / "launch.sh"
    script.write_text(_render("pbs", str(bin_dir / "tether")))
    runner = f'pbs_tmrsh() {{ local host=$1; shift; FAKE_HOST=$host exec "$@"; }}\nsource {script}\n'
    start = time.monotonic()
    result = subprocess.run(["bash", "-c", runner], capture_output=True, text=True, timeout=60,
                            env={**env, "PBS_NODEFILE": str(nodefile), "FAIL_HOST": "h2", "FAKE_SLEEP": "60"})
    assert result.returncode == 3 and time.monotonic() - start < 30
    assert "tether: a host's container exited with status 3; ending the job" in result.stderr
    for call in _recorded(out).values():        # the other hosts' launches were killed and waited for
        assert not Path(f"/proc/{call['pid']}").exists() or \
            Path(f"/proc/{call['pid']}/stat").read_text().split()[2] == "Z"


def test_pbs_script_refuses_to_run_outside_a_job(tmp_path, fakes):
    bin_dir, _, env = fakes
    script = tmp_path / "launch.sh"
    script.write_text(_render("pbs", str(bin_dir / "tether")))
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "PBS_NODEFILE is not set" in result.stderr


def test_slurm_script_runs_tether_once_per_node_through_srun(tmp_path, fakes):
    """The script as a batch job of the testing kit's fake Slurm: its srun runs one task per node."""
    from tether.testing import FakeSlurm

    bin_dir, out, env = fakes
    slurm = FakeSlurm(tmp_path / "slurm", addresses={"n1": "10.0.0.1"})
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\n" + slurm_launch_script(COMMAND, OPTIONS, {**HOSTILE, "NODE_RANK": "7"},
                                                            tether=str(bin_dir / "tether")))
    job_id = slurm.sbatch("--nodes=3", str(script), cwd=tmp_path,
                          env=slurm.env({**env, "TETHER_CONTAINER_IMAGE": "/would/wrap/twice"}))
    final = slurm.run_job(job_id)
    assert final["state"] == "COMPLETED", Path(final["stdout"]).read_text()
    (srun,) = [c for c in slurm.calls() if c["tool"] == "srun"]
    assert srun["argv"][1:4] == ["--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    calls = _recorded(out)
    assert sorted(calls) == ["n1", "n2", "n3"]
    for call in calls.values():
        assert call["argv"][-len(COMMAND) - 1:] == ["--", *COMMAND]
        assert all(call["env"][k] == v for k, v in HOSTILE.items())
        assert "TETHER_CONTAINER_IMAGE" not in call["env"]       # srun's task is not wrapped again
    # each node's container finds the others as the PBS script's hosts (and a tether step's ranks) do:
    # the first node's NodeAddr, the job's port; NODE_RANK is the node's own, whatever the job said
    assert [(c["env"]["NODE_RANK"], c["env"]["TETHER_NNODES"], c["env"]["MASTER_ADDR"], c["env"]["MASTER_PORT"])
            for _, c in sorted(calls.items())] == [(str(i), "3", "10.0.0.1", str(12288 + int(job_id) * 16))
                                                   for i in range(3)]
    failing = slurm.run_job(slurm.sbatch("--nodes=2", str(script), cwd=tmp_path,
                                         env=slurm.env({**env, "FAIL_HOST": "n2"})))
    assert failing["state"] == "FAILED" and failing["exit_code"] == "3:0"


def test_scripts_refuse_bad_input():
    with pytest.raises(LaunchError, match="not valid in a launch script"):
        pbs_launch_script(["true"], {"container-image": "/i"}, {"BAD-NAME": "x"})
    with pytest.raises(LaunchError, match="needs a command"):
        slurm_launch_script([], {"container-image": "/i"}, {})
    with pytest.raises(LaunchError, match="must be an absolute path"):
        slurm_launch_script(["true"], {"container-image": "/i", "container-mounts": "rel:/x"}, {})


def test_pbs_script_collects_every_host_even_when_they_end_at_once(tmp_path):
    """Hosts whose launches end together are each counted once with their status (an earlier version
    used `wait -n`, which answered 127 for children bash had already reaped)."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"h{i}\n" for i in range(8)))
    script = tmp_path / "launch.sh"
    script.write_text(pbs_launch_script(["true"], {"container-image": "/i"}, {}, tether="/bin/true"))
    runner = (f'pbs_tmrsh() {{ shift; exec "$@"; }}\n'
              f'for i in $(seq 100); do ( source {script} ) || {{ echo "run $i: $?"; exit 1; }}; done\n')
    result = subprocess.run(["bash", "-c", runner], env={"PATH": "/usr/bin:/bin", "PBS_NODEFILE": str(nodefile),
                                                         "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_pbs_hosts_task_the_mom_never_ran_fails_the_job_visibly(tmp_path, fakes):
    """pbs_tmrsh exits 0 without a word when a MoM's execjob_launch hook rejects the task (recorded:
    tmrsh-task-rejected-by-launch-hook; the fake OpenPBS replays it). Each host's task leaves a
    marker first; a host without one fails the job with a message, the others' containers having
    run; a job whose every task ran ends 0 and leaves nothing behind."""
    from tether.testing.pbs import FakePbs

    bin_dir, out, env = fakes
    hook = tmp_path / "site_launch.py"
    hook.write_text("import pbs\ne = pbs.event()\n"
                    "if pbs.get_local_nodename() == 'n2':\n    e.reject('site: no tasks on n2 today')\ne.accept()\n")
    pbs = FakePbs(tmp_path / "pbs", launch_hooks=[hook])
    script = tmp_path / "job.sh"
    shared = tmp_path / "shared"
    script.write_text(pbs_launch_script(["true"], {"container-image": "/i"}, {"A": "1"}, tether=str(bin_dir / "tether"),
                                        env_dir=str(shared)))
    results = []
    for select in ("select=3:ncpus=1", "select=1:ncpus=1"):          # n1..n3 (n2 refuses), then n1 alone
        job_id = pbs.qsub("-l", select, "-v", f"FAKE_OUT={out}", str(script), cwd=tmp_path)
        results.append(subprocess.run(["bash", str(script)], env=pbs.run_job(job_id), capture_output=True,
                                      text=True, timeout=60))
    rejected, fine = results
    assert rejected.returncode == 255, rejected.stderr
    # (the other hosts' tasks may still print: ending the job does not reach a TM task)
    assert rejected.stderr.startswith("tether: the task on n2 never started (pbs_tmrsh exit 0: the MoM did not run it; its "
                               "execjob_launch hook may have rejected it, see that MoM's log)\n"
                               "tether: a host's container exited with status 255; ending the job\n"), \
        rejected.stderr
    assert "site: no tasks on n2 today" in (pbs.state_dir / "mom.log").read_text()
    assert (fine.returncode, fine.stderr) == (0, "")
    assert list(shared.iterdir()) == [] and _recorded(out)                  # the others' containers ran


CPU_SPEC = "resource_pool: null\nslots_per_trial: 6\nslot_type: cpu\nslurm: {slots_per_node: 2}\npbs: {slots_per_node: 2}\n"


@pytest.mark.parametrize("scheduler,directive,launch", [
    ("slurm", "#SBATCH --nodes=3", "exec srun --nodes="), ("pbs", "#PBS -l select=3:ncpus=2", "pbs_tmrsh")])
def test_tether_plan_with_a_command_prints_a_whole_batch_script(tmp_path, capsys, scheduler, directive, launch):
    """`tether plan SPEC -- COMMAND` (a whole generated batch script): the directives, then one
    container per node running COMMAND through `tether run`; options may follow SPEC.yaml."""
    from tether.cli.main import main

    spec = tmp_path / "job.yaml"
    spec.write_text(CPU_SPEC)
    script = tmp_path / "job.sh"
    assert main(["plan", "--scheduler", scheduler, str(spec), "--container-image=ubuntu:22.04", "--",
                 "python", "train.py", "--lr", "it's"]) == 0
    script.write_text(capsys.readouterr().out)
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and directive in text and launch in text
    assert "--container-image=ubuntu:22.04" in text and "'it'\"'\"'s'" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert main(["plan", str(spec), "--", "true"]) == 2                        # no image: refused
    assert "needs --container-image" in capsys.readouterr().err
    assert main(["plan", str(spec), "--container-image=img.sif", "--", "true"]) == 2
    assert "expected a path" in capsys.readouterr().err

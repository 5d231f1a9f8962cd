"""Workflow packs (issue 18, docs/requirements.md) without a cluster: the pack file, what is submitted (fake
sbatch/qsub record their argv), which jobs a release or a dependency change touches (fake squeue
and scontrol). On the real cluster: tests/cluster/test_workflow_cluster.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tether.workflow import PackError, parse_pack, release, set_dependency, submit_pack
from tether.workflow.pack import dependents

PACK = {"name": "pc", "jobs": [{"name": "producer", "script": "#!/bin/sh\ntrue\n", "sbatch_args": ["-N1"]},
                               {"name": "consumer", "delay": 2, "command": ["echo", "a b"]},
                               {"name": "late", "delay": "1h", "command": ["true"]}]}


def _fake(bin_dir: Path, name: str, script: str) -> None:
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "calls"
    _fake(d, "sbatch", f'printf "%s\\n" "$*" >> {log}; echo "$TETHER_PACK $TETHER_PACK_JOB" >> {log}.env\n'
                       f'n=$(wc -l < {log}); echo $((500 + n))\n')
    _fake(d, "scancel", f'echo "scancel $*" >> {log}\n')
    _fake(d, "scontrol", f'echo "scontrol $*" >> {log}\n')
    return d


def _env(bin_dir: Path) -> dict:
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "USER": "u"}


def test_a_pack_file_is_checked_whole():
    name, jobs = parse_pack(PACK)
    assert name == "pc" and [(j.name, j.delay) for j in jobs] == [("producer", 0), ("consumer", 2), ("late", 60)]
    with pytest.raises(PackError) as exc:
        parse_pack({"jobs": [{"name": "a", "delay": 5, "command": ["x"], "script": "y"}, {"name": "a"}]})
    text = str(exc.value)
    assert "jobs[0].delay: the first job starts the pack" in text and "give a command or a script" in text
    assert "'a' is used twice" in text
    with pytest.raises(PackError, match="jobs.1..delay: 'soon' is not minutes"):
        parse_pack({"jobs": [{"name": "a", "command": ["x"]}, {"name": "b", "delay": "soon", "command": ["x"]}]})
    with pytest.raises(PackError, match="at least one job"):
        parse_pack({"jobs": []})


def test_the_first_job_goes_in_as_it_is_and_the_others_after_its_start_plus_their_delay(bin_dir, tmp_path):
    result = submit_pack(PACK, env=_env(bin_dir))
    pack = result["pack"]
    assert pack.startswith("pc-") and result["jobs"] == {"producer": "501", "consumer": "502", "late": "503"}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith(f"--parsable --comment=tether-pack:{pack}:producer --export=ALL -N1 /tmp/")
    assert calls[1] == (f"--parsable --comment=tether-pack:{pack}:consumer --export=ALL --dependency=after:501+2 "
                        f"--wrap=echo 'a b'")
    assert "--dependency=after:501+60" in calls[2]
    assert (tmp_path / "calls.env").read_text().splitlines() == [f"{pack} producer", f"{pack} consumer", f"{pack} late"]


def test_a_refused_job_takes_the_pack_back(bin_dir, tmp_path):
    _fake(bin_dir, "sbatch", f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n\n'
                             f'[ $n -ge 1 ] && {{ echo "sbatch: error: invalid partition" >&2; exit 1; }}; echo 700\n')
    with pytest.raises(PackError, match="consumer: sbatch refused it: sbatch: error: invalid partition"):
        submit_pack(PACK, env=_env(bin_dir))
    assert (tmp_path / "calls").read_text() == "scancel 700\n"


def test_release_and_set_dependency_touch_only_the_packs_pending_jobs_waiting_on_this_one(bin_dir, tmp_path):
    rows = ["41|RUNNING|(null)|tether-pack:p-1:producer|a",
            "42|PENDING|after:41+5(unfulfilled)|tether-pack:p-1:consumer|b",
            "43|PENDING|afterok:41(unfulfilled)|tether-pack:p-1:other|c",
            "44|PENDING|after:410+5(unfulfilled)|tether-pack:p-1:x|d",          # another job's id, not 41
            "45|PENDING|after:41+5(unfulfilled)|tether-pack:q-2:consumer|e",    # another pack
            "46|RUNNING|after:41+5|tether-pack:p-1:running|f"]                  # not pending any more
    _fake(bin_dir, "squeue", "cat <<'EOF'\n" + "\n".join(rows) + "\nEOF\n")
    env = {**_env(bin_dir), "SLURM_JOB_ID": "41"}
    assert [r["id"] for r in dependents(env=env)] == ["42", "43"]
    assert release(env=env) == ["42", "43"]
    assert set_dependency("afterok", env=env) == ["42", "43"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["scontrol update JobId=42 Dependency=after:41", "scontrol update JobId=43 Dependency=after:41",
                     "scontrol update JobId=42 Dependency=afterok:41", "scontrol update JobId=43 Dependency=afterok:41"]
    with pytest.raises(PackError, match="--type later: one of after, afterok, afterany, aftercorr"):
        set_dependency("later", env=env)
    _fake(bin_dir, "squeue", "echo '41|RUNNING|(null)||a'\n")
    with pytest.raises(PackError, match="not in a tether pack"):
        release(env=env)
    with pytest.raises(PackError, match="give --job ID, or run this inside a job"):
        release(env=_env(bin_dir))


def test_a_pbs_pack_uses_depend_after_and_an_execution_time(tmp_path):
    from tether.testing.pbs import FakePbs

    pbs = FakePbs(tmp_path / "pbs")
    pack = {"jobs": [{"name": "a", "command": ["true"]}, {"name": "b", "delay": 3, "command": ["true"]}]}
    result = submit_pack(pack, env=pbs.env(), scheduler="pbs")
    first, second = result["jobs"]["a"], result["jobs"]["b"]
    qsubs = [c["argv"] for c in pbs.calls() if c["tool"] == "qsub"]
    assert ["-W", f"depend=after:{first}"] == qsubs[1][3:5] and "-a" in qsubs[1]
    assert pbs.job(second)["Variable_List"]["TETHER_PACK_JOB"] == "b"


def test_a_pbs_packs_status_comes_from_qstat(tmp_path, capsys):
    """On PBS, `tether workflow status` ran squeue ("squeue: fatal: ...", issue 40): it reads the
    pack's jobs from qstat (their TETHER_PACK variables), by the pack's id or its name."""
    from tether.cli.main import main
    from tether.testing.pbs import FakePbs

    pbs = FakePbs(tmp_path / "pbs")
    pack = {"name": "pp", "jobs": [{"name": "a", "command": ["true"]}, {"name": "b", "delay": 3, "command": ["true"]}]}
    result = submit_pack(pack, env=pbs.env(), scheduler="pbs")
    old = dict(os.environ)
    os.environ.update(pbs.env())
    try:
        for asked in (result["pack"], "pp"):
            assert main(["workflow", "status", "--scheduler", "pbs", "--json", asked]) == 0
            rows = json.loads(capsys.readouterr().out)
            assert [(r["job"], r["id"], r["pack"]) for r in rows] == [("a", result["jobs"]["a"], result["pack"]),
                                                                      ("b", result["jobs"]["b"], result["pack"])]
        assert main(["workflow", "status", "--scheduler", "pbs", "other"]) == 1
        assert "no pack other" in capsys.readouterr().err
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_a_finished_pbs_packs_jobs_say_whether_they_succeeded(tmp_path):
    """On a real OpenPBS (issue 40) `tether workflow status --scheduler pbs` printed FINISHED for a
    producer that exited 0 and a consumer that exited 3 alike (qstat's job_state F): a pack's ended
    jobs are COMPLETED/FAILED/CANCELLED with their exit code, as the launcher reports PBS jobs and as
    sacct does on Slurm; waiting ones PENDING."""
    from tether.testing.pbs import FakePbs
    from tether.workflow import pack_status

    pbs = FakePbs(tmp_path / "pbs")
    pack = {"name": "pf", "jobs": [{"name": "a", "command": ["true"]}, {"name": "b", "delay": 1, "command": ["false"]},
                                   {"name": "c", "delay": 1, "command": ["true"]}]}
    result = submit_pack(pack, env=pbs.env(), scheduler="pbs")
    with pbs.state.jobs() as data:
        for name, (letter, code) in {"a": ("F", 0), "b": ("F", 3), "c": ("W", None)}.items():
            data["jobs"][result["jobs"][name]].update(job_state=letter, Exit_status=code)
    rows = {r["job"]: r for r in pack_status(result["pack"], pbs.env(), scheduler="pbs")}
    assert [(rows[n]["state"], rows[n]["exit_code"]) for n in "abc"] == [("COMPLETED", 0), ("FAILED", 3),
                                                                         ("PENDING", None)]


def test_status_takes_the_packs_id_or_its_name_and_says_when_there_is_none(tmp_path, bin_dir, capsys):
    """`tether workflow status pc` (the pack's name) printed nothing and exited 0, as did an unknown
    id: only the generated id worked (issue 45). A name shows every pack of that name, each row
    with its pack; nothing found is an error naming what to give."""
    from tether.cli.main import main

    _fake(bin_dir, "squeue", 'printf "%s\\n" "601|PENDING|after:600|tether-pack:pc-1a2b3c:consumer|c" '
                             '"600|RUNNING||tether-pack:pc-1a2b3c:producer|p" "700|RUNNING||tether-pack:pc2-ffffff:x|x" '
                             '"800|RUNNING||tether-pack:pc-9f9f9f:producer|p"\n')
    _fake(bin_dir, "sacct", "true\n")
    os.environ["PATH"], old = f"{bin_dir}:/usr/bin:/bin", os.environ["PATH"]
    try:
        assert main(["workflow", "status", "pc-1a2b3c"]) == 0
        out = capsys.readouterr().out.split()
        assert out == ["producer", "600", "RUNNING", "consumer", "601", "PENDING", "after:600"]
        assert main(["workflow", "status", "pc"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[:3] for line in lines] == [["pc-1a2b3c", "producer", "600"],
                                                         ["pc-1a2b3c", "consumer", "601"],
                                                         ["pc-9f9f9f", "producer", "800"]]   # not pc2-...
        assert main(["workflow", "status", "nosuch"]) == 1
        assert "no pack nosuch among your jobs" in capsys.readouterr().err
    finally:
        os.environ["PATH"] = old

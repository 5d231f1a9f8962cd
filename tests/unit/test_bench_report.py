"""bench/report.py: the README's performance table comes from what one `make bench` recorded."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import report  # noqa: E402
import summary  # noqa: E402


def test_recorded_figures_become_the_readme_table_and_nothing_else_changes(tmp_path, monkeypatch):
    jsonl = tmp_path / "summary.jsonl"
    monkeypatch.setenv("TETHER_BENCH_SUMMARY", str(jsonl))
    summary.record("step.py", "a tether step / no plugin", "1.036 (0.89–1.15)", "<= 1.05", True)
    summary.record("launch.py", "rootfs: tether / direct", "1.087 (1.04–1.12)", "<= 1.05", False)
    summary.record("floor.py", "podman+crun", "refused here")
    readme = tmp_path / "README.md"
    readme.write_text("# t\nbefore\n<!-- bench:start -->\nold table\n<!-- bench:end -->\nafter\n")
    assert report.main(["report.py", str(jsonl), str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# t\nbefore\n<!-- bench:start -->\nMeasured by `make bench` on ")
    assert text.endswith("\n<!-- bench:end -->\nafter\n") and "old table" not in text
    assert "Load average over the run's last 15 minutes: " in text       # how busy the machine was
    assert "| `step.py` | a tether step / no plugin | 1.036 (0.89–1.15) | <= 1.05 | yes |" in text
    assert "| `launch.py` | rootfs: tether / direct | 1.087 (1.04–1.12) | <= 1.05 | **no** |" in text
    assert "| `floor.py` | podman+crun | refused here |  |  |" in text
    assert [json.loads(l)["bench"] for l in jsonl.read_text().splitlines()] == ["step.py", "launch.py", "floor.py"]


def test_no_figures_or_no_block_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_BENCH_SUMMARY", raising=False)
    summary.record("x", "y", "z")                     # not asked to record: nothing written anywhere
    empty, readme = tmp_path / "empty.jsonl", tmp_path / "README.md"
    empty.write_text("")
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no figures"):
        report.main(["report.py", str(empty), str(readme)])
    empty.write_text(json.dumps({"bench": "b", "figure": "f", "value": "v"}) + "\n")
    with pytest.raises(SystemExit, match="no <!-- bench:start -->"):
        report.main(["report.py", str(empty), str(readme)])
    assert readme.read_text() == "no markers\n"


def test_the_direct_baselines_leftover_cgroups_go_and_nothing_else(tmp_path):
    """bench/launch.py removes the empty child cgroups the direct podman runs left below the
    sandbox nodes' uid_* directories (a job of the same id on a rebuilt sandbox could not start
    over them) -- never one still in use, another host's, or what a symlinked controller names."""
    import launch

    leaked = tmp_path / "memory/slurm_n1/uid_1001/job_5/step_0/task_0/0123abcd"
    leaked.mkdir(parents=True)
    busy = tmp_path / "memory/slurm_n2/uid_1001/job_6"
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("42\n")      # rmdir refuses it, as cgroupfs does one in use
    other = tmp_path / "memory/slurm_x9/uid_1/job_1"
    other.mkdir(parents=True)
    (tmp_path / "cpu").symlink_to("memory")

    class Box:
        nodes = ("n1", "n2", "n3")

    assert launch.remove_baseline_cgroups(Box(), str(tmp_path)) == 4
    assert not (tmp_path / "memory/slurm_n1/uid_1001/job_5").exists()
    assert (tmp_path / "memory/slurm_n1/uid_1001").is_dir() and busy.is_dir() and other.is_dir()

"""tether's PBS server hook, run as PBS runs it: the real hook file (pbs_hooks/tether_submit.py)
executed against the stub ``pbs`` module (tether.testing), with its JSON hook config.
Covers every row of the PBS resource table, the select-merge rule and the rejections.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tether.system.toolchain import tether_import_path

from helpers import REPO, run_hook_file

HOOK = REPO / "pbs_hooks" / "tether_submit.py"
from tether.testing.pbs import pbs_module  # noqa: E402

pbs = pbs_module()  # the stand-in (tether.testing)


def write_hook_config(path: Path, config_text: str) -> None:
    """The submit hook's JSON config as `tether pbs install` writes it, from a config's YAML text
    (not validated here: the hook validates, and must refuse a bad one)."""
    path.write_text(json.dumps({"python_path": [tether_import_path()], "config_source": "/etc/tether/tether.yaml",
                                "config": yaml.safe_load(config_text) or {}}))


@pytest.fixture
def hook(tmp_path):
    """Run the hook file for an event; returns the event (accepted?, reject message, the job)."""
    hook_config = tmp_path / "tether_submit.json"
    write_hook_config(hook_config, "default_aux_resource_pool: aux\n")

    def run(event_type=pbs.QUEUEJOB, *, config_text: str | None = None, **kw):
        if config_text is not None:
            write_hook_config(hook_config, config_text)
        event = pbs.stub_event(event_type, config_file=str(hook_config),
                               queues=("workq", "gpu", "aux"), **kw)
        return run_hook_file(HOOK, event)

    return run


def test_jobs_without_tether_resources_are_untouched(hook):
    e = hook(resources={"select": "2:ncpus=4", "walltime": "1:00:00"})
    assert e.accepted and e.job._changed == set()
    assert str(e.job.Resource_List["select"]) == "2:ncpus=4"


@pytest.mark.parametrize("slot_type,spn,select", [
    ("cuda", 4, "2:ngpus=4"), ("rocm", 2, "4:ngpus=2"), ("cuda", None, "8:ngpus=1"),
    ("cpu", 4, "2:ncpus=4"), ("cpu", None, "8:ncpus=1"),
])
def test_table_rows(hook, slot_type, spn, select):
    resources = {"tether_slots": 8, "tether_slot_type": slot_type}
    if spn:
        resources["tether_slots_per_node"] = spn
    e = hook(resources=resources)
    assert e.accepted, e.reject_msg
    assert str(e.job.Resource_List["select"]) == select and isinstance(e.job.Resource_List["select"], pbs.select)
    assert str(e.job.Resource_List["place"]) == "scatter"
    assert (bool(e.job.Rerunable), int(e.job.umask)) == (False, 0o022)
    assert isinstance(e.job.Rerunable, pbs.pbs_bool) and isinstance(e.job.umask, pbs.pbs_int)


def test_gpu_without_gres_and_aux_rows(hook):
    e = hook(resources={"tether_slots": 8, "tether_slots_per_node": 4}, config_text="gres_supported: false\n")
    assert e.accepted and str(e.job.Resource_List["select"]) == "2"
    aux = hook(resources={"tether_slots": 0}, config_text="default_aux_resource_pool: aux\n")
    assert aux.accepted and str(aux.job.Resource_List["select"]) == "1" and str(aux.job.queue) == "aux"


def test_select_merge_keeps_chunk_resources_and_says_what_it_replaced(hook):
    e = hook(resources={"tether_slots": 8, "tether_slots_per_node": 4, "select": "3:ngpus=2:mem=10gb",
                        "place": "pack:excl"})
    assert e.accepted, e.reject_msg
    assert str(e.job.Resource_List["select"]) == "2:ngpus=4:mem=10gb"
    assert str(e.job.Resource_List["place"]) == "scatter:excl"
    assert "chunk count 3 replaced by 2" in e.job.comment and "ngpus=2 replaced by ngpus=4" in e.job.comment
    assert "arrangement pack replaced by scatter" in e.job.comment
    assert any("replaced" in msg for _, msg in pbs.LOG)


def test_queue_is_the_resource_pool_and_project_from_config(hook):
    e = hook(resources={"tether_slots": 2}, config_text="default_compute_resource_pool: gpu\n"
                                                        "job_project_source: user\n", requestor="bob")
    assert e.accepted and str(e.job.queue) == "gpu" and str(e.job.project) == "bob"


@pytest.mark.parametrize("resources,message", [
    ({"tether_slots": 8, "tether_slots_per_node": 3}, "tether: tether_slots_per_node=3 does not divide tether_slots=8; choose one of 1, 2, 4, 8"),
    ({"tether_slots_per_node": 2}, "tether: -l tether_slots_per_node, tether_slot_type and tether_gpu_type need -l tether_slots"),
    ({"tether_slots": 2, "tether_slot_type": "tpu"}, "tether_slot_type"),
    ({"tether_slots": 2, "ngpus": 2}, "tether: qsub options: -l ngpus=2 conflicts with the select statement"),
])
def test_rejections_carry_a_message_the_user_can_act_on(hook, resources, message):
    e = hook(resources=resources, defined={"ngpus": "long", **pbs.TETHER_RESOURCES})
    assert e.accepted is False and message in e.reject_msg, e.reject_msg


def test_a_broken_config_rejects_tether_jobs_only(hook):
    e = hook(resources={"tether_slots": 2}, config_text="slot_type: gpu\n")
    assert e.accepted is False and e.reject_msg.startswith("tether unavailable: ")
    plain = hook(resources={"select": "1:ncpus=1"}, config_text="slot_type: gpu\n")
    assert plain.accepted


def test_an_unloadable_tether_rejects_tether_jobs_and_passes_others(hook, tmp_path):
    (tmp_path / "tether_submit.json").write_text("{not json")
    e = hook(resources={"tether_slots": 2})
    assert e.accepted is False and "tether unavailable: the hook cannot load tether" in e.reject_msg
    assert hook(resources={"select": "1:ncpus=1"}).accepted


def test_qalter_replans_from_the_changes_and_the_original_job(hook):
    e = hook(pbs.MODIFYJOB, resources={"tether_slots_per_node": 2},
             original={"tether_slots": 8, "tether_slots_per_node": 4, "select": "2:ngpus=4:mem=10gb",
                       "place": "scatter"})
    assert e.accepted, e.reject_msg
    assert str(e.job.Resource_List["select"]) == "4:ngpus=2:mem=10gb"
    again = hook(pbs.MODIFYJOB, resources={"select": "4:ngpus=2:mem=10gb"},
                 original={"tether_slots": 8, "tether_slots_per_node": 2, "select": "4:ngpus=2:mem=10gb"})
    assert again.accepted and str(again.job.Resource_List["select"]) == "4:ngpus=2:mem=10gb"   # idempotent
    assert "queue" not in again.job._changed                   # modifyjob may not move the job


def test_the_stub_refuses_what_pbs_refuses():
    with pytest.raises(pbs.BadAttributeValueError):
        pbs.select("2:ngpus")
    with pytest.raises(pbs.BadAttributeValueError):
        pbs.place("everywhere")
    e = pbs.stub_event(pbs.MODIFYJOB, resources={})
    with pytest.raises(pbs.BadAttributeValueError):
        e.job.queue = pbs.queue("workq")
    with pytest.raises(pbs.BadAttributeValueError):        # converted to pbs.select, and refused
        e.job.Resource_List["select"] = "2:ngpus"
    e.job.Resource_List["SELECT"] = "2:ncpus=1"               # names match case-insensitively on set
    assert isinstance(e.job.Resource_List["select"], pbs.select) and str(e.job.Resource_List["select"]) == "2:ncpus=1"
    with pytest.raises(pbs.UnsetResourceNameError):          # a server hook cannot invent a resource
        e.job.Resource_List["ngpus"] = 2
    with pytest.raises(AttributeError):                      # not defined on this server
        e.job.Resource_List["ngpus"]
    assert e.job.Resource_List["ncpus"] is None               # defined, not asked for
    with pytest.raises(pbs.EventIncompatibleError):          # queuejob has no job_o
        pbs.stub_event(pbs.QUEUEJOB).job_o
    e = pbs.stub_event(pbs.QUEUEJOB, resources={"tether_probe": "abc", "walltime": "1:00"},
                       defined={"tether_probe": "long", **pbs.TETHER_RESOURCES})
    assert e.job.Resource_List["tether_probe"] is None        # a malformed custom long value is dropped
    assert int(e.job.Resource_List["walltime"]) == 60 and str(e.job.Resource_List["walltime"]) == "1:00"
    with pytest.raises(SystemExit):
        e.accept()
    with pytest.raises(pbs.BadAttributeValueError):          # nothing changes after accept()
        e.job.Resource_List["place"] = "scatter"


def test_a_stock_server_without_ngpus_accepts_a_gpu_job(hook):
    """Regression (issue 13, item 1): on a real server ``Resource_List["ngpus"]`` raises
    AttributeError until an admin creates ngpus; tether's hook read it and rejected every job with
    "tether unavailable: internal error (AttributeError)". The stand-in raised nothing then."""
    e = hook(resources={"tether_slots": "2", "tether_slots_per_node": "2"}, defined=pbs.TETHER_RESOURCES)
    assert e.accepted, e.reject_msg
    assert str(e.job.Resource_List["select"]) == "1:ngpus=2"
    with pytest.raises(AttributeError):
        e.job.Resource_List["ngpus"]


@pytest.fixture(scope="module")
def interpreter(tmp_path_factory):
    """pbs_server's kind of hook interpreter, compiled once for the tests below."""
    from tether.testing.pbs import ServerInterpreter

    return ServerInterpreter(tmp_path_factory.mktemp("interp-build"))


def test_the_submit_hook_survives_pbs_servers_interpreter_restart(tmp_path_factory, interpreter):
    """Regression (issue 13, item 2): `qmgr -c "create resource ..."` makes pbs_server restart its
    hook interpreter; the hook then loaded pyyaml's C extension again and every tether job failed
    with "metaclass conflict" until the server restarted. Run the shipped hook in pbs_server's
    kind of interpreter (kept across jobs, Py_Finalize + Py_Initialize in between)."""
    from tether.testing.pbs import submit_hook_config
    from tether.hooks.configfile import load_config

    work = tmp_path_factory.mktemp("interp")
    hook_config = work / "tether_submit.json"
    hook_config.write_text(json.dumps(submit_hook_config(load_config(None, env={}))))
    job = {"type": "queuejob", "resources": {"tether_slots": "4", "tether_slots_per_node": "2",
                                             "tether_slot_type": "cpu"}}
    gpu = {"type": "queuejob", "resources": {"tether_slots": "2"}, "defined": {"ngpus": "long", **pbs.TETHER_RESOURCES}}
    rounds = interpreter.run(HOOK, hook_config, [[job, gpu, job], [job, gpu], [job]])
    outcomes = [o for r in rounds for o in r]
    assert [o["round"] for o in outcomes] == [0, 0, 0, 1, 1, 2]
    for o in outcomes:
        assert "exception" not in o and o["accepted"], o
    assert [o["resources"]["select"] for o in outcomes] == ["2:ncpus=2", "2:ngpus=1", "2:ncpus=2", "2:ncpus=2",
                                                           "2:ngpus=1", "2:ncpus=2"]


def test_the_interpreter_shows_a_c_extension_that_cannot_restart(tmp_path_factory, interpreter):
    """The check above can fail: a hook importing pyyaml's C extension fails after the restart, as
    on the real server."""
    yaml_dir = str(Path(yaml.__file__).resolve().parent.parent)
    work = tmp_path_factory.mktemp("interp-yaml")
    hook = work / "yaml_hook.py"
    hook.write_text("import sys\nimport pbs\nsys.path.append(%r)\nimport yaml\n"
                    "class Loader(yaml.CSafeLoader):\n    pass\npbs.event().accept()\n" % yaml_dir)
    rounds = interpreter.run(hook, work / "none.json", [[{"type": "queuejob"}], [{"type": "queuejob"}]])
    assert rounds[0][0]["accepted"] and "exception" not in rounds[0][0]
    assert "metaclass conflict" in rounds[1][0]["exception"]


# ---- tether pbs install ------------------------------------------------------------------------
def test_pbs_install_prints_what_it_would_do_and_changes_nothing(tmp_path, capsys):
    from tether.cli.main import main

    os.chmod(tmp_path, 0o755)
    config = tmp_path / "tether.yaml"
    config.write_text(f"job_storage_root: {tmp_path / 'jobs'}\n")
    argv = ["pbs", "install", "--config", str(config), "--hook-dir", str(tmp_path / "etc"),
            "--libexec", str(tmp_path / "libexec")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tether.yaml"]     # a print mode writes nothing
    assert "nothing was changed" in printed
    with pytest.MonkeyPatch.context() as mp:                                  # --apply, qmgr not run here
        mp.setattr("tether.admin.pbs.run_command", lambda argv, **kw: None)
        assert main([*argv, "--apply"]) == 0
    out = capsys.readouterr().out
    submit_json, exec_json = tmp_path / "etc" / "tether_submit.json", tmp_path / "etc" / "tether_exec.json"
    installed = Path(json.loads(submit_json.read_text())["python_path"][0]) / "tether" / "pbs_hooks"
    expected = [
        "qmgr -c 'create resource tether_slots type=string,flag=m'",
        "qmgr -c 'create resource tether_slots_per_node type=string,flag=m'",
        "qmgr -c 'create resource tether_slot_type type=string,flag=m'",
        "qmgr -c 'create resource tether_gpu_type type=string,flag=m'",
        "qmgr -c 'create hook tether_submit'",
        "qmgr -c 'set hook tether_submit event = \"queuejob,modifyjob\"'",
        "qmgr -c 'set hook tether_submit order = 1'",
        "qmgr -c 'set hook tether_submit alarm = 30'",
        f"qmgr -c 'import hook tether_submit application/x-python default {installed / 'tether_submit.py'}'",
        f"qmgr -c 'import hook tether_submit application/x-config default {submit_json}'",
        "qmgr -c 'set hook tether_submit enabled = true'",
        "qmgr -c 'create hook tether_exec'",
        "qmgr -c 'set hook tether_exec event = \"execjob_begin,execjob_launch,execjob_end,execjob_abort\"'",
        "qmgr -c 'set hook tether_exec order = 1'",
        "qmgr -c 'set hook tether_exec alarm = 30'",
        f"qmgr -c 'import hook tether_exec application/x-python default {installed / 'tether_exec.py'}'",
        f"qmgr -c 'import hook tether_exec application/x-config default {exec_json}'",
        "qmgr -c 'set hook tether_exec enabled = true'",
    ]
    assert [line for line in printed.splitlines() if line.startswith("qmgr")] == expected
    assert [line for line in out.splitlines() if line.startswith("qmgr")] == expected
    for name in ("tether_submit.py", "tether_exec.py"):
        assert (installed / name).read_text() == (REPO / "pbs_hooks" / name).read_text()
    submit_settings = json.loads(submit_json.read_text())
    assert submit_settings["config_source"] == str(config)
    assert submit_settings["config"]["job_storage_root"] == str(tmp_path / "jobs")   # validated, as data
    settings = json.loads(exec_json.read_text())
    assert settings["job_storage_root"] == str(tmp_path / "jobs") and (tmp_path / "jobs").is_dir()
    assert settings["helper"] == str(tmp_path / "libexec" / "tether-jobdirs")
    assert settings["launcher"] == str(tmp_path / "libexec" / "tether-run")
    usage = subprocess.run([settings["helper"]], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: tether-jobdirs")
    assert (tmp_path / "libexec" / "tether-run").read_bytes()[:4] == b"\x7fELF"       # the C rank launcher
    assert (tmp_path / "libexec" / "tether-run-py").read_text().startswith("#!")  # the Python one behind it
    assert "sched_config" in out and "resources_available.ngpus" in out


def test_pbs_install_apply_runs_qmgr_and_keeps_existing_resources(tmp_path, fp):
    from tether.hooks.configfile import load_config
    from tether.admin.pbs import install, qmgr_commands

    fp.allow_unregistered(True)                                  # gcc builds the helper for real
    os.chmod(tmp_path, 0o755)
    config_file = tmp_path / "tether.yaml"
    config_file.write_text(f"job_storage_root: {tmp_path / 'jobs'}\n")
    config = load_config(str(config_file))
    kw = dict(hook_dir=tmp_path / "etc", libexec=tmp_path / "libexec", apply=True, log=lambda m: None)
    cmds = qmgr_commands(tmp_path / "etc")
    for cmd in cmds:
        if cmd == "create resource tether_slots type=string,flag=m":
            fp.register(["qmgr", "-c", cmd], returncode=207,       # as recorded: openpbs-qmgr-cases.json
                        stderr="qmgr obj=tether_slots svr=default: Duplicate entry in list \n"
                               "qmgr: Error (15055) returned from server\n")
        else:
            fp.register(["qmgr", "-c", cmd])
    assert install(config, **kw) == cmds
    assert fp.call_count(["qmgr", "-c", fp.any()]) == len(cmds)
    fp.register(["qmgr", "-c", cmds[0]], returncode=2, stderr="qmgr: cannot connect to server")
    with pytest.raises(Exception, match="cannot connect to server"):
        install(config, **kw)


def test_pbs_install_apply_run_again_updates_the_hooks(tmp_path, monkeypatch):
    """Issue 40, 4: `tether pbs install --apply` a second time (the README says so after changing
    tether.yaml) stopped at `create hook tether_submit` (qmgr exit 32, "already registered") and
    applied nothing after it. Through the fake qmgr, which answers as the recorded one."""
    from tether.admin.pbs import SUBMIT_HOOK, EXEC_HOOK, install
    from tether.hooks.configfile import load_config
    from tether.testing.pbs import FakePbs

    fake = FakePbs(tmp_path / "pbs", custom_resources={})          # a stock server
    monkeypatch.setenv("PATH", fake.env()["PATH"])
    os.chmod(tmp_path, 0o755)
    config_file = tmp_path / "tether.yaml"
    config_file.write_text(f"job_storage_root: {tmp_path / 'jobs'}\n")
    kw = dict(hook_dir=tmp_path / "etc", libexec=tmp_path / "libexec", apply=True)
    first: list[str] = []
    install(load_config(str(config_file)), log=first.append, **kw)
    server = json.loads((fake.state_dir / "server.json").read_text())
    assert set(server["hooks"]) == {SUBMIT_HOOK, EXEC_HOOK}
    assert server["hooks"][SUBMIT_HOOK]["attributes"]["alarm"] == "30"
    # the admin changes tether.yaml and the hook's event list was changed by hand: run it again
    config_file.write_text(f"job_storage_root: {tmp_path / 'jobs2'}\n")
    assert fake.run("qmgr", "-c", f"set hook {SUBMIT_HOOK} enabled = false").returncode == 0
    again: list[str] = []
    install(load_config(str(config_file)), log=again.append, **kw)
    assert f"qmgr -c 'create hook {SUBMIT_HOOK}': already there, kept (the commands after it update it)" in again
    assert "qmgr -c 'create resource tether_slots type=string,flag=m': already there, kept (the commands " \
           "after it update it)" in again
    server = json.loads((fake.state_dir / "server.json").read_text())
    assert server["hooks"][SUBMIT_HOOK]["attributes"]["enabled"] == "true"
    imported = server["hooks"][EXEC_HOOK]["contents"]["application/x-config"]
    assert json.loads(imported["text"])["job_storage_root"] == str(tmp_path / "jobs2")
    qmgr_calls = [c["argv"] for c in fake.calls() if c["tool"] == "qmgr"]
    assert qmgr_calls[-1] == ["qmgr", "-c", f"set hook {EXEC_HOOK} enabled = true"]


def test_container_variables_are_checked_at_qsub_with_the_run_side_s_messages(hook):
    e = hook(resources={}, Variable_List={"TETHER_CONTAINER_IMAGE": "/images/busybox",
                                          "TETHER_CONTAINER_MOUNTS": "relative:/data"})
    assert e.accepted is False
    assert e.reject_msg == ("tether: TETHER_CONTAINER_MOUNTS: 'relative:/data': the source must be an absolute path, "
                            "a relative path (starting with '.'), 'tmpfs' or 'umount' (./relative for a path "
                            "relative to the working directory)")
    e = hook(resources={}, Variable_List={"TETHER_CONTAINER_WORKDIR": "/w"})
    assert e.accepted is False and "TETHER_CONTAINER_* options need TETHER_CONTAINER_IMAGE" in e.reject_msg
    e = hook(resources={}, Variable_List={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted and e.job._changed == set()               # valid, nothing to plan
    e = hook(resources={"tether_slots": 2}, Variable_List={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted and str(e.job.Resource_List["select"]) == "2:ngpus=1"
    # a Slurm-only option is refused, not silently ignored; a --no-container-* variable alone is checked
    e = hook(resources={}, Variable_List={"TETHER_CONTAINER_IMAGE": "/images/busybox", "TETHER_CONTAINER_BATCH": "1"})
    assert e.accepted is False and "TETHER_CONTAINER_BATCH is for Slurm" in e.reject_msg
    e = hook(resources={}, Variable_List={"TETHER_NO_CONTAINER_ENTRYPOINT": "1"})
    assert e.accepted is False and "need TETHER_CONTAINER_IMAGE" in e.reject_msg
    # gateway nodes (Slurm heterogeneous jobs) too, alone or with slots
    for resources in ({}, {"tether_slots": 2}):
        e = hook(resources=resources, Variable_List={"TETHER_GATEWAY_COUNT": "1"})
        assert e.accepted is False and "TETHER_GATEWAY_COUNT: gateway nodes are a component of a Slurm" in e.reject_msg


def test_qalter_of_container_variables_is_checked_against_the_job_s_own(hook):
    e = hook(pbs.MODIFYJOB, resources={}, original={}, Variable_List={"TETHER_CONTAINER_MOUNTS": "/d:/d"},
             original_variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted, e.reject_msg                             # the job has its image already
    e = hook(pbs.MODIFYJOB, resources={}, original={}, Variable_List={"TETHER_CONTAINER_MOUNTS": "d:/d"},
             original_variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted is False and "TETHER_CONTAINER_MOUNTS: 'd:/d': the source must be an absolute path" in e.reject_msg
    e = hook(pbs.MODIFYJOB, resources={}, original={}, Variable_List={"OTHER": "x"},
             original_variables={"TETHER_CONTAINER_IMAGE": "/images/busybox"})
    assert e.accepted and e.job._changed == set()               # nothing tether checks changed

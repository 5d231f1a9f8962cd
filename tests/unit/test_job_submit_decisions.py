"""The job_submit handler's decisions, pinned: a table of representative requests (every Slurm table
row, the options that change a plan, the refusals with their messages, container options, gateway
components, scontrol updates) under several configurations, each answer -- the code, every field
written, the message for the user, the shape marks for the C shim's cache and the log lines --
compared with the one recorded in tests/fixtures/job_submit_decisions.json.

The recording was made before the handler's new-shape path was made cheaper (issue 43): a change
that makes it faster cannot change what it decides without this test saying which answer moved. A
deliberate change of a decision rewrites the recording (TETHER_RECORD_DECISIONS=1) and shows in
its diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path

import pytest

from tether.job_submit.handler import ACCEPT, ON_WORKER, REJECT, Handler
from tether.testing.slurm import JobSubmit, PluginLib, bridge_ffi

RECORDING = Path(__file__).resolve().parent.parent / "fixtures" / "job_submit_decisions.json"

CONFIGS = {
    # the sandbox's kind: podman, gateway nodes, the defaults otherwise
    "sandbox": "container:\n  runtime: podman\ngateways:\n  partition: gateway\n  daemon: [/bin/true]\n",
    "tres-gres": "default_compute_resource_pool: gpu\ndefault_aux_resource_pool: aux\njob_project_source: account\n"
                 "partition_overrides:\n  cpu:\n    slot_type: cpu\n  a100:\n    gpu_type: a100\n"
                 "  ib:\n    sbatch_args: ['--constraint=ib']\n  tasks:\n    sbatch_args: ['--ntasks=4']\n"
                 "gateways:\n  partition: gw\n  feature: gwnode\n  daemon: [/bin/true]\n",
    "gres-only": "tres_supported: false\ndefault_compute_resource_pool: gpu\njob_project_source: user\n"
                 "container:\n  runtime: enroot\npartition_overrides:\n  cpu:\n    slot_type: cpu\n"
                 "  v100:\n    gpu_type: v100\n",
    "no-gres": "tres_supported: false\ngres_supported: false\nslot_type: rocm\n",
    "tres-no-gres": "gres_supported: false\nslot_type: cpu\n",
}

NO_USER = 4_242_424      # a uid without a name
RANDOM_REQUESTS = 2000


def env(*forwarded: tuple[str, str], spank: tuple[tuple[str, str], ...] = (), other: dict | None = None) -> dict:
    """spank_job_env: each option as sbatch forwards one given on its command line (Slurm's
    _SLURM_SPANK_OPTION_tether_<name> and the plugin's TETHER_<NAME>), ``spank`` only Slurm's."""
    out = dict(other or {})
    for name, value in forwarded:
        out["_SLURM_SPANK_OPTION_tether_" + name.replace("-", "_")] = value
        out["TETHER_" + name.upper().replace("-", "_")] = value
    for name, value in spank:
        out["_SLURM_SPANK_OPTION_tether_" + name.replace("-", "_")] = value
    return out


S = lambda n: ("slots", str(n))                       # noqa: E731
P = lambda n: ("slots-per-node", str(n))              # noqa: E731
IMAGE = ("container-image", "bench/app:r0-1")

REQUESTS: dict[str, dict] = {
    # bench/submit.py's requests: distinct (one shape) and new shapes (a --container-env each)
    "bench-distinct": {"spank_env": env(IMAGE, S(6), P(2))},
    "bench-new-shape": {"spank_env": env(IMAGE, ("container-env", "BENCH_R0_1"), S(12), P(4))},
    "bench-new-shape-1": {"spank_env": env(IMAGE, ("container-env", "BENCH_R3_7"), S(1), P(1))},
    # the rows: slots alone, with slots per node, zero, a slot type, a GPU type, a pool
    "slots": {"spank_env": env(S(6))},
    "slots-spn": {"spank_env": env(S(8), P(4))},
    "slots-spn-equal": {"spank_env": env(S(4), P(4))},
    "zero-slots": {"spank_env": env(S(0))},
    "zero-slots-spn": {"spank_env": env(S(0), P(2))},
    "cpu": {"spank_env": env(S(64), P(32), ("slot-type", "cpu"))},
    "cpu-no-spn": {"spank_env": env(S(3), ("slot-type", "cpu"))},
    "rocm": {"spank_env": env(S(4), P(2), ("slot-type", "rocm"))},
    "gpu-type": {"spank_env": env(S(4), P(2), ("gpu-type", "h100"))},
    "gpu-type-cpu": {"spank_env": env(S(4), ("slot-type", "cpu"), ("gpu-type", "h100"))},
    "pool": {"spank_env": env(S(4), ("resource-pool", "a100"))},
    "pool-cpu": {"spank_env": env(S(8), P(4), ("resource-pool", "cpu"))},
    "pool-ib": {"spank_env": env(S(2), ("resource-pool", "ib"))},
    "pool-tasks": {"spank_env": env(S(2), ("resource-pool", "tasks"))},
    "partition": {"spank_env": env(S(4), P(2)), "partition": "a100"},
    "partition-and-same-pool": {"spank_env": env(S(4), ("resource-pool", "cpu")), "partition": "cpu"},
    "partition-and-pool": {"spank_env": env(S(4), ("resource-pool", "cpu")), "partition": "a100"},
    "account": {"spank_env": env(S(2)), "account": "proj"},
    "account-bad-wckey": {"spank_env": env(S(2)), "account": "proj x"},
    "no-user-name": {"spank_env": env(S(2)), "uid": NO_USER},
    "big": {"spank_env": env(S(10_000_000), P(8))},
    # the forwarded value wins over Slurm's; Slurm's alone counts
    "forwarded-wins": {"spank_env": {"_SLURM_SPANK_OPTION_tether_slots": "8", "TETHER_SLOTS": "4"}},
    "spank-only": {"spank_env": env(spank=(S(6), P(3)))},
    "other-plugins-entries": {"spank_env": env(S(2), other={"OTHER=x": "1", "_SLURM_SPANK_OPTION_other_slots": "9",
                                                            "TETHER_JOB_SLOTS": "7"})},
    # refusals of values and of layouts
    "slots-not-a-number": {"spank_env": env(("slots", "abc"))},
    "slots-fullwidth": {"spank_env": {"_SLURM_SPANK_OPTION_tether_slots": "\uff14"}},
    "slots-too-many": {"spank_env": env(S(10_000_001))},
    "slots-leading-zero": {"spank_env": env(("slots", "07"))},
    "spn-zero": {"spank_env": env(S(4), P(0))},
    "spn-larger": {"spank_env": env(S(2), P(4))},
    "spn-not-dividing": {"spank_env": env(S(6), P(4))},
    "spn-not-dividing-many": {"spank_env": env(S(720720), P(7))},
    "spn-without-slots": {"spank_env": env(P(2))},
    "slot-type-bad": {"spank_env": env(S(2), ("slot-type", "tpu"))},
    "gpu-type-bad": {"spank_env": env(S(2), ("gpu-type", "a/100"))},
    "pool-long": {"spank_env": env(S(2), ("resource-pool", "p" * 200))},
    # the user's own options that conflict with the plan
    "with-nodes": {"spank_env": env(S(4)), "min_nodes": 2},
    "with-nodes-range": {"spank_env": env(S(4)), "min_nodes": 1, "max_nodes": 3},
    "nodelist-derived": {"spank_env": env(S(4)), "min_nodes": 2, "req_node_count": 2},
    "with-ntasks": {"spank_env": env(S(4), P(2)), "num_tasks": 2},
    "with-ntasks-per-node": {"spank_env": env(S(4), P(2)), "ntasks_per_node": 1, "num_tasks": 2},
    "with-cpus-per-task": {"spank_env": env(S(4), ("slot-type", "cpu")), "cpus_per_task": 4},
    "with-cpus-per-task-gpu": {"spank_env": env(S(4)), "cpus_per_task": 4},
    "with-gpus": {"spank_env": env(S(4)), "tres_per_job": "gres:gpu:4"},
    "with-gres-gpu": {"spank_env": env(S(4), P(2)), "tres_per_node": "gres:gpu:2"},
    "with-gres-other": {"spank_env": env(S(4), P(2)), "tres_per_node": "gres:tmp:10,gres:nic:1"},
    "with-gpus-per-task": {"spank_env": env(S(4)), "tres_per_task": "gres:gpu:1"},
    "with-gpus-per-socket": {"spank_env": env(S(4)), "tres_per_socket": "gres:gpu:1"},
    "with-typed-gpus": {"spank_env": env(S(4)), "tres_per_job": "gres:gpu:a100:4"},
    # container options: checked at submit, with the run side's messages
    "image-only": {"spank_env": env(("container-image", "ubuntu:22.04"))},
    "image-empty": {"spank_env": env(("container-image", ""))},
    "image-empty-and-env": {"spank_env": env(("container-image", ""), ("container-env", "A"))},
    "image-bad": {"spank_env": env(S(2), ("container-image", "Bad Image"))},
    "image-upper": {"spank_env": env(S(2), ("container-image", "Ubuntu:22.04"))},
    "image-local": {"spank_env": env(S(2), ("container-image", "/shared/app.sif"))},
    "image-relative": {"spank_env": env(S(2), ("container-image", "./app.sqsh"))},
    "image-uri": {"spank_env": env(S(2), ("container-image", "docker://nvcr.io/nvidia/pytorch:24.01-py3"))},
    "env-without-image": {"spank_env": env(S(2), ("container-env", "A,B"))},
    "env-bad": {"spank_env": env(IMAGE, ("container-env", "A,1B"))},
    "env-spaces": {"spank_env": env(IMAGE, ("container-env", "A, B"))},
    "runtime": {"spank_env": env(IMAGE, S(2), ("container-runtime", "enroot"))},
    "runtime-bad": {"spank_env": env(IMAGE, S(2), ("container-runtime", "docker"))},
    "name": {"spank_env": env(IMAGE, S(2), ("container-name", "keep"))},
    "name-apptainer": {"spank_env": env(IMAGE, S(2), ("container-name", "keep"), ("container-runtime", "apptainer"))},
    "name-flag-bad": {"spank_env": env(IMAGE, ("container-name", "keep:sometimes"))},
    "name-alone": {"spank_env": env(("container-name", "keep:exec"))},
    "mounts": {"spank_env": env(IMAGE, S(2), ("container-mounts", "/data:/data:ro,tmpfs:/scratch:size=1G"))},
    "mounts-relative-target": {"spank_env": env(IMAGE, ("container-mounts", "/data:data"))},
    "mounts-bad-flag": {"spank_env": env(IMAGE, ("container-mounts", "/data:/data:rox"))},
    "mounts-own-point": {"spank_env": env(IMAGE, ("container-mounts", "/x:/tmp"))},
    "mounts-ro-rw": {"spank_env": env(IMAGE, ("container-mounts", "/d:/d:ro+rw"))},
    "workdir": {"spank_env": env(IMAGE, S(2), ("container-workdir", "../w"))},
    "writable-and-readonly": {"spank_env": env(IMAGE, ("container-writable", "1"), ("container-readonly", "yes"))},
    "writable-bad": {"spank_env": env(IMAGE, ("container-writable", "maybe"))},
    "mount-home-both": {"spank_env": env(IMAGE, ("container-mount-home", ""), ("no-container-mount-home", ""))},
    "unshare": {"spank_env": env(IMAGE, S(2), ("container-unshare", "net,ipc"))},
    "unshare-bad": {"spank_env": env(IMAGE, ("container-unshare", "net,pid"))},
    "unshare-apptainer": {"spank_env": env(IMAGE, ("container-unshare", "net"), ("container-runtime", "apptainer"))},
    "save": {"spank_env": env(IMAGE, ("container-save", "/shared/saved.sqsh"), ("container-runtime", "enroot"))},
    "save-apptainer": {"spank_env": env(IMAGE, ("container-save", "/shared/x.sif"),
                                        ("container-runtime", "apptainer"))},
    "entrypoint": {"spank_env": env(IMAGE, S(2), ("container-entrypoint", "1"))},
    # gateway components of a heterogeneous job
    "gateways": {"spank_env": env(("gateways", "2")), "het_job_offset": 1},
    "gateways-not-het": {"spank_env": env(("gateways", "2"))},
    "gateways-with-slots": {"spank_env": env(("gateways", "2"), S(2)), "het_job_offset": 1},
    "gateways-with-nodes": {"spank_env": env(("gateways", "1")), "het_job_offset": 1, "min_nodes": 2},
    "gateways-partition": {"spank_env": env(("gateways", "1")), "het_job_offset": 1, "partition": "debug"},
    "gateways-constraint": {"spank_env": env(("gateways", "1")), "het_job_offset": 1, "features": "ib&fast"},
    "gateways-constraint-or": {"spank_env": env(("gateways", "1")), "het_job_offset": 1, "features": "ib|fast"},
}

# scontrol update of a tether job: (update, the job's record)
MODIFIES: dict[str, tuple[dict, dict]] = {
    "partition-same-row": ({"partition": "a100"}, {"spank_env": env(S(4), P(2)), "partition": "gpu"}),
    "partition-other-row": ({"partition": "cpu"}, {"spank_env": env(S(4), P(2))}),
    "partition-bad-layout": ({"partition": "gpu"}, {"spank_env": env(S(6), P(4))}),
    "nodes": ({"min_nodes": 3}, {"spank_env": env(S(4), P(2))}),
    "gpus": ({"tres_per_job": "gres:gpu:8"}, {"spank_env": env(S(4))}),
    "time-only": ({}, {"spank_env": env(S(4))}),
    "container-only-job": ({"partition": "cpu"}, {"spank_env": env(IMAGE)}),
    "bad-record": ({"partition": "cpu"}, {"spank_env": env(("slots", "x"))}),
}

ANSWER_NUMBERS = ("num_tasks", "ntasks_per_node", "cpus_per_task", "requeue")
ANSWER_TEXTS = ("tres_per_job", "tres_per_node", "tres_per_task", "partition", "wckey", "features")
QUANTITIES = ("min_nodes", "max_nodes", "num_tasks", "ntasks_per_node", "cpus_per_task", "tres_per_job",
              "tres_per_task", "tres_per_node")


def answer(js: JobSubmit, c, rc: int) -> dict:
    """Everything the handler wrote into ``c`` and its code, plus the log lines since the last answer."""
    ffi = js.ffi
    out: dict = {"rc": {ACCEPT: "accept", REJECT: "reject"}.get(rc, rc)}
    if c.set_nodes:
        out["nodes"] = [c.out_min_nodes, c.out_max_nodes]
    for key in ANSWER_NUMBERS:
        if getattr(c, "set_" + key):
            out[key] = getattr(c, "out_" + key)
    for key in ANSWER_TEXTS:
        if getattr(c, "set_" + key):
            out[key] = ffi.string(getattr(c, "out_" + key)).decode()
    if c.msg[0] != b"\0":
        out["msg"] = ffi.string(c.msg).decode()
    if c.cacheable:
        out["cacheable"] = 1
    if c.shaped:
        out["shaped"] = {q: getattr(c, "q_" + q) for q in QUANTITIES if getattr(c, "q_" + q)}
    if js.lib.log:
        out["log"] = [f"{level} {line}" for level, line in js.lib.log]
        js.lib.log.clear()
    return out


def handler_for(tmp_path: Path, config: str) -> JobSubmit:
    path = tmp_path / f"{config}.yaml"
    path.write_text(CONFIGS[config])
    js = JobSubmit.__new__(JobSubmit)
    js.ffi, js.lib, js._keep = bridge_ffi(), PluginLib(), []
    js.handler = Handler(js.ffi, js.lib, env={"TETHER_CONFIG": str(path), "SLURM_CONF": str(tmp_path / "none")})
    assert js.handler.init() == ACCEPT
    js.lib.log.clear()
    return js


def submit(js: JobSubmit, c, uid: int, handed_over: list | None = None, prepare=None) -> int:
    """The handler's answer to ``c``; with ``handed_over`` (a list), asked first as on slurmctld's
    own thread (worker.c's run_here: ``direct``, the config current), and again as on the worker
    when it answers ON_WORKER -- which it may only do with nothing written and nothing logged.
    ``prepare(js, c)`` first: what the shim's C gives the call (test_shape_cache: its values)."""
    if prepare is not None:
        prepare(js, c)
    if handed_over is None:
        return js.handler.submit(c, uid, 1)
    c.direct = c.config_current = 1
    rc = js.handler.submit(c, uid, 1)
    if rc != ON_WORKER:
        return rc
    assert answer(js, c, rc) == {"rc": ON_WORKER}
    handed_over.append(uid)
    c.direct = 0
    return js.handler.submit(c, uid, 1)


def decisions(tmp_path: Path, again: bool = False, handed_over: dict | None = None, prepare=None) -> dict:
    """Every request's and update's answer under every config; and per config, a digest of the
    answers to RANDOM_REQUESTS requests drawn as test_shape_cache draws them (seeded). ``again``:
    each request is asked twice of one handler and the second answer taken (the handler's kept plans).
    ``handed_over`` (a dict): each submission asked first as on slurmctld's own thread (submit()),
    the uids of those handed over to the worker kept per config. ``prepare``: see submit()."""
    from test_shape_cache import random_request

    out: dict = {}
    for config in CONFIGS:
        js = handler_for(tmp_path, config)
        mine = None if handed_over is None else handed_over.setdefault(config, [])
        for job in REQUESTS.values() if again else ():
            js.handler.submit(js.struct({"uid": 0, **job}), job.get("uid", 0), 1)
        js.lib.log.clear()
        rng, digest = random.Random(f"decisions-{config}"), hashlib.sha256()
        for _ in range(RANDOM_REQUESTS):
            job = random_request(rng, names=False)
            job["uid"] = 0 if job["uid"] == 1000 else NO_USER       # names the same on every machine
            c = js.struct(job)
            rc = submit(js, c, job["uid"], mine, prepare)
            digest.update(json.dumps([job, answer(js, c, rc)], sort_keys=True).encode())
        out[f"{config} random {RANDOM_REQUESTS}"] = digest.hexdigest()
        for name, job in REQUESTS.items():
            job = {"uid": 0, **job}
            c = js.struct(job)
            rc = submit(js, c, job["uid"], mine, prepare)
            out[f"{config} submit {name}"] = answer(js, c, rc)
        for name, (update, current) in MODIFIES.items():
            u, c = js.struct({"uid": 0, **update}), js.struct({"uid": 0, **current})
            rc = js.handler.modify(u, c, 0)
            out[f"{config} modify {name}"] = answer(js, u, rc)
    return out


def test_the_handlers_decisions_are_the_recorded_ones(tmp_path):
    found = decisions(tmp_path)
    if os.environ.get("TETHER_RECORD_DECISIONS") == "1":
        RECORDING.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                                 for k, v in found.items()) + "\n}\n", encoding="utf-8")
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    assert sorted(found) == sorted(recorded), "the table and the recording name other requests"
    moved = {k: (recorded[k], v) for k, v in found.items() if recorded[k] != v}
    assert not moved, "\n".join(f"{k}:\n  recorded {r}\n  now      {v}" for k, (r, v) in moved.items())


def test_a_plan_kept_answers_as_the_plan_made_anew(tmp_path):
    """Every request asked a second time (its plan then kept by the handler) gets the recorded answer."""
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    found = decisions(tmp_path, again=True)
    moved = {k: (recorded[k], v) for k, v in found.items() if recorded[k] != v}
    assert not moved, "\n".join(f"{k}:\n  recorded {r}\n  now      {v}" for k, (r, v) in moved.items())


def test_on_slurmctlds_own_thread_the_handler_answers_as_on_its_worker_or_hands_the_call_over(tmp_path,
                                                                                              monkeypatch):
    """A submission run on slurmctld's own thread (worker.c's run_here: no time limit guards it)
    gets the recorded answer, or -- where the answer needs a user's name not known yet, an NSS
    lookup that may hang -- is handed to the worker untouched. Only job_project_source: user needs
    names (the WCKey), and each uid's is looked up once: the worker's lookup serves later calls."""
    from tether.job_submit import handler as module

    monkeypatch.setattr(module, "_users", {})       # no name known yet (the module keeps them)
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    handed_over: dict = {}
    found = decisions(tmp_path, handed_over=handed_over)
    moved = {k: (recorded[k], v) for k, v in found.items() if recorded[k] != v}
    assert not moved, "\n".join(f"{k}:\n  recorded {r}\n  now      {v}" for k, (r, v) in moved.items())
    assert {config: sorted(uids) for config, uids in handed_over.items()} == {
        config: sorted({0, NO_USER}) if "job_project_source: user" in text else [] for config, text in CONFIGS.items()}


def test_a_users_name_is_looked_up_again_once_the_config_is_loaded_again(tmp_path, monkeypatch):
    """Names are kept as the answers made with them are, until the config is read again: a uid
    given to another user since then gets the new user's name (the WCKey), looked up on the worker."""
    from tether.job_submit import handler as module

    monkeypatch.setattr(module, "_users", {})
    js = handler_for(tmp_path, "gres-only")
    handed_over: list = []
    for slots in (2, 4):                # two plans (a kept plan looks nothing up), one lookup
        submit(js, js.struct({"uid": 0, "spank_env": env(S(slots))}), 0, handed_over)
    assert handed_over == [0]
    path = Path(js.handler.path)
    path.write_text(CONFIGS["gres-only"] + "# read again\n")
    assert js.handler.refresh() is not None
    js.lib.log.clear()
    submit(js, js.struct({"uid": 0, "spank_env": env(S(6))}), 0, handed_over)
    assert handed_over == [0, 0]


def test_kept_plans_follow_the_config(tmp_path):
    """A plan kept under one config is not the answer under the next: the handler plans again."""
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    js = handler_for(tmp_path, "tres-gres")
    path = Path(js.handler.path)
    for n, config in enumerate(("tres-gres", "gres-only", "no-gres", "tres-gres")):
        if n:
            path.write_text(CONFIGS[config])         # another size: another file to the handler
        for name in ("account", "slots-spn", "pool-cpu", "zero-slots"):
            c = js.struct({"uid": 0, **REQUESTS[name]})     # config_current 0: the handler stats the file
            got = answer(js, c, js.handler.submit(c, 0, 1))
            got.pop("log", None)
            want = dict(recorded[f"{config} submit {name}"])
            want.pop("log", None)
            assert got == want, (config, name)


def test_kept_plans_are_bounded(tmp_path, monkeypatch):
    """No more than PLAN_ANSWERS plans are kept; past that they are made again, alike."""
    from tether.job_submit import handler as module

    monkeypatch.setattr(module, "PLAN_ANSWERS", 4)
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    js = handler_for(tmp_path, "sandbox")
    names = [n for n in REQUESTS if n.startswith(("slots", "cpu", "rocm", "gpu-type", "pool", "zero"))]
    for name in names * 2:
        c = js.struct({"uid": 0, **REQUESTS[name]})
        assert answer(js, c, js.handler.submit(c, 0, 1)) == recorded[f"sandbox submit {name}"], name
        assert len(js.handler._answers) <= 4
    assert len(names) > 8


def test_the_table_covers_every_answer():
    """The recording holds accepts and refusals, shaped and unshaped answers, notes, every row."""
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    answers = [a for a in recorded.values() if isinstance(a, dict)]
    assert {a["rc"] for a in answers} == {"accept", "reject"}
    assert sum("shaped" in a for a in answers) >= 50 and sum("note" in a.get("msg", "") for a in answers) >= 10
    accepted = [a for a in answers if a["rc"] == "accept" and "nodes" in a]
    for written in ("tres_per_job", "tres_per_task", "tres_per_node", "cpus_per_task", "partition", "wckey",
                    "features"):      # each field of the answer, in some answers and not in others
        assert 0 < sum(written in a for a in accepted) < len(accepted), written
    assert {a["nodes"][0] for a in answers if "nodes" in a} >= {1, 2, 3, 4}


@pytest.mark.parametrize("via_call", [False, True])
def test_the_entry_point_answers_as_the_method(tmp_path, via_call):
    """handler.call("submit", ...) -- what the C shim calls -- gives the method's answer."""
    from tether.job_submit import handler as module

    js = handler_for(tmp_path, "sandbox")
    c = js.struct({"uid": 0, **REQUESTS["bench-new-shape"]})
    saved = module._handler
    module._handler = js.handler
    try:
        rc = module.call("submit", c, 0, 1) if via_call else js.handler.submit(c, 0, 1)
    finally:
        module._handler = saved
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    assert answer(js, c, rc) == recorded["sandbox submit bench-new-shape"]


def test_an_internal_error_is_logged_from_the_frames_without_reading_a_file(tmp_path, monkeypatch):
    """handler.call's log of an exception says where it was raised from the frames alone: on
    slurmctld's own thread (worker.c's run_here) no module is imported and no source file read --
    a slow filesystem would hold slurmctld's locks."""
    import linecache
    import sys

    from tether.job_submit import handler as module

    js = handler_for(tmp_path, "sandbox")
    monkeypatch.setattr(module, "_handler", js.handler)
    monkeypatch.setattr(js.handler, "submit", lambda *args: 1 // 0)
    linecache.clearcache()                  # a source line read before is not read again
    opened: list = []
    watching = [True]
    sys.addaudithook(lambda event, args: opened.append((event, args[0])) if watching[0] and event in (
        "open", "import") else None)
    try:
        rc = module.call("submit", None, 0, 1)
    finally:
        watching[0] = False
    assert rc == module.FAILED and opened == []
    text = "\n".join(line for _, line in js.lib.log)
    assert text.startswith("internal error in submit:\nTraceback (most recent call last):") and \
        re.search(r'File ".*handler\.py", line \d+, in call\n', text) and \
        text.endswith("ZeroDivisionError: integer division or modulo by zero"), text

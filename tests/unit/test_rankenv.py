"""The rank environment: slurmstepd's C (spank/rankenv.c, compiled here as the plugin compiles it)
against tether.hooks.rankenv over many steps and tasks -- job and step ids (the batch script's and
the other special steps' too), slots, nodes, tasks per node, heterogeneous components and offsets,
slot types and GPUs -- and the rule's other users (the PBS hook, the fake srun, the launch scripts)
against the same function."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import pbs_hooks
from tether.container.rank_launcher import RANK_LAUNCHER_SOURCE, baked_header
from tether.container.scripts import pbs_launch_script, slurm_launch_script
from tether.hooks import rankenv
from tether.hooks.rankenv import SLURM_BATCH_SCRIPT, SlurmStep, SlurmTask, master_port, slurm_rank_env
from tether.hooks.surface import LAUNCHER_VAR, MASTER_PORT_BASE, MASTER_PORT_JOBS, RANK_ENV, env_macro
from tether.native.build import names_header, source_dir as native_source_dir
from tether.spank.build import source_dir
from tether.system.toolchain import CBuild

SETTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)


class CStep(ctypes.Structure):
    """struct tether_rank_step (spank/rankenv.h)."""
    _fields_ = [("job_id", ctypes.c_uint32), ("step_id", ctypes.c_uint32), ("ntasks", ctypes.c_uint32),
                ("nlocal", ctypes.c_uint32), ("nnodes", ctypes.c_uint32), ("job_dir", ctypes.c_char_p),
                ("step_dir", ctypes.c_char_p), ("het", ctypes.c_int), ("het_component", ctypes.c_uint32),
                ("het_components", ctypes.c_uint32), ("het_leader", ctypes.c_uint32)]


class CTask(ctypes.Structure):
    """struct tether_rank_task (spank/rankenv.h)."""
    _fields_ = [("global_id", ctypes.c_uint32), ("node_id", ctypes.c_uint32), ("local_id", ctypes.c_int),
                ("procid", ctypes.c_long), ("ntasks", ctypes.c_long), ("node_index", ctypes.c_long),
                ("nnodes", ctypes.c_long), ("slot_type", ctypes.c_char_p), ("gpus", ctypes.c_char_p)]


@pytest.fixture(scope="module")
def rankenv_c(tmp_path_factory):
    """spank/rankenv.c in a ctypes library, compiled with the plugin's flags and header."""
    work = tmp_path_factory.mktemp("rankenv-c")
    cbuild = CBuild(work)
    rankenv_o = cbuild.compile(source_dir() / "rankenv.c", include_dirs=[str(native_source_dir())])
    lib = ctypes.CDLL(str(cbuild.link([rankenv_o], work / "librankenv.so", shared=True)))
    lib.tether_rank_step_env.argtypes = [ctypes.POINTER(CStep), SETTER, ctypes.c_void_p]
    lib.tether_rank_task_env.argtypes = [ctypes.POINTER(CStep), ctypes.POINTER(CTask), SETTER, ctypes.c_void_p]
    lib.tether_rank_local_tasks.argtypes = [ctypes.POINTER(CStep)]
    lib.tether_rank_local_tasks.restype = ctypes.c_uint32
    return lib


def _c_step(step: SlurmStep) -> CStep:
    component, components, leader = step.het or (0, 0, 0)
    return CStep(step.job_id, step.step_id, step.ntasks, step.nlocal, step.nnodes, step.job_dir.encode(),
                 step.step_dir.encode(), int(step.het is not None), component, components, leader)


def _c_task(task: SlurmTask) -> CTask:
    return CTask(task.global_id, task.node_id, task.local_id, task.procid, task.ntasks, task.node_index,
                 task.nnodes, None if task.slot_type is None else task.slot_type.encode(),
                 None if task.gpus is None else task.gpus.encode("utf-8", "surrogateescape"))


def c_rank_env(lib, step: SlurmStep, task: SlurmTask) -> tuple[dict[str, str], dict[str, str]]:
    """What rankenv.c sets, step part and task part, as slurmstepd's setenv leaves them (the last
    value of a name wins)."""
    parts: list[dict[str, str]] = [{}, {}]
    current = parts[0]

    @SETTER
    def setter(ctx, name, value):
        current[name.decode()] = value.decode("utf-8", "surrogateescape")
        return 0

    c_step = _c_step(step)
    assert lib.tether_rank_step_env(ctypes.byref(c_step), setter, None) == 0
    current = parts[1]
    assert lib.tether_rank_task_env(ctypes.byref(c_step), ctypes.byref(_c_task(task)), setter, None) == 0
    return parts[0], parts[1]


uint32 = st.integers(0, 2**32 - 1)
counts = st.integers(0, 64) | st.integers(0, 2**32 - 1)
step_ids = st.integers(0, 40) | st.integers(0, 0xFFFFFFEF) | st.integers(0xFFFFFFF0, 2**32 - 1) | \
    st.just(SLURM_BATCH_SCRIPT)
het = st.none() | st.tuples(st.integers(0, 1023), st.integers(2, 1024), st.integers(0, 2**31 - 1))
whole_step = st.integers(-1, 70) | st.integers(-1, 2**31 - 1)        # env_number: -1 or below 2^31
paths = st.sampled_from(["/var/lib/tether/jobs/1/n1/step-0", "/j/7/node-a/step-batch", "/x"]) | \
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60).map(lambda p: "/" + p)
gpus = st.none() | st.sampled_from(["", "0", "0,1", "GPU-1f3c,GPU-77aa"]) | \
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40)


@st.composite
def steps_and_tasks(draw) -> tuple[SlurmStep, SlurmTask]:
    step_dir = draw(paths)
    step = SlurmStep(job_id=draw(uint32), step_id=draw(step_ids), ntasks=draw(counts), nlocal=draw(counts),
                     nnodes=draw(counts), job_dir=draw(paths), step_dir=step_dir, het=draw(het))
    global_id = draw(st.integers(0, 70) | uint32)
    procid = global_id + draw(st.integers(0, 20))           # a whole step's rank at or past the task's
    task = SlurmTask(global_id=global_id, local_id=draw(st.integers(0, 2**31 - 1)), node_id=draw(uint32),
                     procid=draw(whole_step) if procid >= 2**31 or draw(st.booleans()) else procid,
                     ntasks=draw(whole_step), node_index=draw(whole_step), nnodes=draw(whole_step),
                     slot_type=draw(st.sampled_from([None, "cuda", "rocm", "cpu"])), gpus=draw(gpus))
    return step, task


@given(steps_and_tasks())
def test_slurmstepd_sets_the_rank_environment_the_python_function_computes(rankenv_c, step_task):
    step, task = step_task
    c_step_env, c_task_env = c_rank_env(rankenv_c, step, task)
    assert c_step_env == rankenv.slurm_step_env(step)
    assert c_task_env == rankenv.slurm_task_env(step, task)
    assert {**c_step_env, **c_task_env} == slurm_rank_env(step, task)
    local = rankenv_c.tether_rank_local_tasks(ctypes.byref(_c_step(step)))
    assert str(local) == slurm_rank_env(step, task)["LOCAL_WORLD_SIZE"]


def test_one_rank_of_a_heterogeneous_step_and_a_batch_script(rankenv_c):
    """The values themselves, for both sides: every variable of the rank environment but
    MASTER_ADDR (slurmstepd's lookup) is computed."""
    step = SlurmStep(job_id=1030, step_id=3, ntasks=2, nlocal=2, nnodes=1, job_dir="/jobs/1031",
                     step_dir="/jobs/1031/n2/step-3", het=(1, 2, 1029))
    task = SlurmTask(global_id=1, local_id=1, node_id=0, procid=5, ntasks=6, node_index=2, nnodes=3,
                     slot_type="rocm", gpus="2,3")
    want = {"TETHER_HET_COMPONENT": "1", "TETHER_HET_COMPONENTS": "2", "TETHER_HET_SIZE": "2",
            "TETHER_HET_OFFSET": "4", "TETHER_JOB_DIR": "/jobs/1031", "TETHER_STEP_DIR": "/jobs/1031/n2/step-3",
            "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "TETHER_NNODES": "3",
            "MASTER_PORT": str(12288 + (1029 % 1024) * 16 + 3), "RANK": "5", "LOCAL_RANK": "1",
            "NODE_RANK": "2", "TETHER_RANK_DIR": "/jobs/1031/n2/step-3/rank-1",
            "TMPDIR": "/jobs/1031/n2/step-3/rank-1/tmp", "TETHER_WORK_DIR": "/jobs/1031/n2/step-3/rank-1/work",
            "TETHER_SLOT_IDS": "2,3", "ROCR_VISIBLE_DEVICES": "2,3"}
    assert slurm_rank_env(step, task) == want
    c_step_env, c_task_env = c_rank_env(rankenv_c, step, task)
    assert {**c_step_env, **c_task_env} == want
    assert set(want) == {v.name for v in RANK_ENV} - {"MASTER_ADDR"}

    batch = SlurmStep(job_id=7, step_id=SLURM_BATCH_SCRIPT, ntasks=8, nlocal=4, nnodes=2, job_dir="/j/7",
                      step_dir="/j/7/n1/step-batch")
    env = slurm_rank_env(batch, SlurmTask(global_id=3, local_id=0, node_id=1, slot_type="cpu", gpus="0"))
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["TETHER_NNODES"], env["RANK"], env["NODE_RANK"]) == \
        ("1", "1", "1", "0", "0")
    assert env["MASTER_PORT"] == str(12288 + 7 * 16 + 15) and "TETHER_SLOT_IDS" not in env


def test_master_port_rule():
    assert master_port(0, 0) == MASTER_PORT_BASE == 12288
    assert master_port(1025, 17) == 12288 + 16 + 1
    assert master_port(5) == master_port(5, 0) == 12288 + 80
    assert master_port(MASTER_PORT_JOBS - 1, SLURM_BATCH_SCRIPT) == 12288 + 1024 * 16 - 1 == 28671
    assert rankenv.master_port_range() == (12288, 28671)
    assert rankenv.pbs_job_number("12[3].srv") == 123 and rankenv.pbs_job_number("srv") == 0
    # only ASCII digits count, as in the C side and the launch script ("²".isdigit() is true, int("²") fails)
    assert rankenv.pbs_job_number("1²3.srv") == 13 and rankenv.pbs_job_number("٣.srv") == 0


def test_the_c_side_spells_no_name_of_the_run_side_contract_itself():
    """Every name of the rank environment and the launcher protocol is in tether_names.h (and
    tether-run's baked header); no C file spells one: a renamed variable is one edit of the table."""
    header = names_header()
    baked = baked_header(None, {"runtime": "podman"}, "/p")
    for key, name in [*((v.key, v.name) for v in RANK_ENV), *LAUNCHER_VAR.items()]:
        assert f'#define {env_macro(key)} "{name}"' in header and f'#define {env_macro(key)} "{name}"' in baked
    names = {v.name for v in RANK_ENV} | set(LAUNCHER_VAR.values())
    for path in [*source_dir().glob("*.c"), *native_source_dir().glob("*.c"), RANK_LAUNCHER_SOURCE,
                 Path(pbs_hooks.__file__).with_name("tether_jobdirs.c")]:
        spelled = {m for m in re.findall(r'"([A-Z][A-Z0-9_]*)=?', path.read_text()) if m in names}
        assert not spelled, f"{path.name} spells {sorted(spelled)}: use TETHER_ENV_* (tether_names.h)"


@pytest.mark.parametrize("job", ["0", "1", "1023", "1024", "4242", "4294967295"])
def test_the_slurm_launch_script_derives_the_functions_port(job, tmp_path):
    import subprocess

    script = slurm_launch_script(["true"], {"container-image": "/i.sif"}, {})
    line = next(l for l in script.splitlines() if "MASTER_PORT=" in l)
    expr = re.search(r"MASTER_PORT=(\$\(\(.*?\)\))", line).group(1)
    out = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job}; echo {expr}"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(master_port(int(job)))


@pytest.mark.parametrize("job", ["0.srv", "17.pbs-server", "12[3].srv", "0099.x", "[].x"])
def test_the_pbs_launch_script_derives_the_hooks_port(job):
    import subprocess

    script = pbs_launch_script(["true"], {"container-image": "/i.sif"}, {})
    start = script.index("number=${PBS_JOBID:-0}")
    block = script[start:script.index("\n", script.index("master_port=", start))]
    out = subprocess.run(["bash", "-c", f"PBS_JOBID='{job}'\n{block}\necho $master_port"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str(master_port(rankenv.pbs_job_number(job)))

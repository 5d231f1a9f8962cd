"""The environment contract (tether.container.environment): what a rank's container inherits,
the allowlist mode, and the README's table of it.
"""

from __future__ import annotations

import pytest

from tether.container.environment import contract_table, passed_from_host

from helpers import REPO
from container_helpers import HOST, spec


# ---- the environment contract ----------------------------------------------------------------
def test_contract_inherits_the_job_environment_but_where_the_image_must_win():
    passed = passed_from_host(HOST, spec(env_names=("PYTHONPATH", "APPTAINER_BIND")))
    assert set(passed) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
                           "SLURM_STEP_ID", "SLURM_PROCID", "PMIX_RANK", "CUDA_VISIBLE_DEVICES",
                           "TETHER_SLOT_IDS", "MYVAR", "OTHER", "PYTHONPATH"}
    assert passed["MYVAR"] == HOST["MYVAR"] and passed["PYTHONPATH"] == "/p"   # named: the host's value
    # never: host paths, tether's own (TMPDIR is set inside), runtime control (even when named),
    # invalid names; the image's own: PATH, HOME, LD_*
    assert not {"TETHER_RANK_DIR", "TMPDIR", "APPTAINER_BIND", "APPTAINERENV_X", "CONTAINERS_CONF",
                "BASH_FUNC_f%%", "LD_PRELOAD", "HOME", "PATH"} & set(passed)
    shell = {"PWD": "/h", "OLDPWD": "/o", "SHLVL": "2", "_": "/bin/env", "BASH_ENV": "/h/.b", "ENV": "/h/.e",
             "LD_LIBRARY_PATH": "/l", "LD_AUDIT": "/a", "PYTHONHOME": "/py", "HF_HOME": "/hf", "OMP_PLACES": "cores"}
    assert set(passed_from_host(shell, spec())) == {"HF_HOME", "OMP_PLACES"}
    assert passed_from_host({"TMPDIR": "/host/tmp"}, spec(rank_dir=None)) == {}     # the runtime's default
    assert passed_from_host({"TMPDIR": "/host/tmp"}, spec(rank_dir=None, env_names=("TMPDIR",))) == {
        "TMPDIR": "/host/tmp"}


def test_contract_allowlist_mode_passes_rank_scheduler_and_named_variables_only():
    passed = passed_from_host(HOST, spec(env_names=("MYVAR", "PATH", "APPTAINER_BIND")), "allowlist")
    assert set(passed) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
                           "SLURM_STEP_ID", "SLURM_PROCID", "PMIX_RANK", "CUDA_VISIBLE_DEVICES",
                           "TETHER_SLOT_IDS", "MYVAR", "PATH"}
    with pytest.raises(ValueError, match="expected one of inherit, allowlist"):
        passed_from_host(HOST, spec(), "everything")


@pytest.mark.parametrize("mode", ["inherit", "allowlist"])
def test_the_jobs_lang_language_and_lc_all_stay_out_unless_named_as_pyxis_keeps_them(mode):
    """pyxis's env.bats "$LANG special case" (issue 45): a host locale the image lacks made perl (and
    bash, Python) warn "Setting locale failed" in every step; pyxis keeps the job's LANG, LANGUAGE
    and LC_ALL out of the container unless --container-env names them ("forcing $LANG
    passthrough"), and so does tether now. The locale's other categories (LC_TIME, ...) enter."""
    host = {"LANG": "en_US.UTF-8", "LANGUAGE": "en_US:en", "LC_ALL": "en_US.UTF-8", "LC_TIME": "C.UTF-8",
            "SLURM_JOB_ID": "7"}
    assert passed_from_host(host, spec(), mode) == {"LC_TIME": "C.UTF-8", "SLURM_JOB_ID": "7"}
    assert passed_from_host(host, spec(env_names=("LANG",)), mode) == {
        "LANG": "en_US.UTF-8", "LC_TIME": "C.UTF-8", "SLURM_JOB_ID": "7"}


def test_contract_table_is_in_the_readme():
    assert contract_table() in (REPO / "README.md").read_text()

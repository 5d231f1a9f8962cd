"""The environment contract (tether.container.environment): what a rank's container inherits,
the allowlist mode, and the README's table of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tether.container.environment import contract_table, entrypoint_split, passed_from_host
from tether.container.runtimes import LATER_FILE, LATER_PART, later_script, later_values
from tether.container.spec import CONTAINER_WORKDIR

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
    # two runtime variables by their whole name only: a job's XDG_RUNTIME_DIR_OLD is its own
    control = {"XDG_RUNTIME_DIR": "/run/user/1", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/b",
               "XDG_RUNTIME_DIR_OLD": "/o", "DBUS_SESSION_BUS_ADDRESS2": "x", "ENROOT_X": "y"}
    assert set(passed_from_host(control, spec(env_names=("XDG_RUNTIME_DIR", "ENROOT_X")))) == {
        "XDG_RUNTIME_DIR_OLD", "DBUS_SESSION_BUS_ADDRESS2"}
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


# ---- --container-entrypoint: what the entrypoint starts with, what follows it (issue 45) -------
def test_the_entrypoint_starts_with_the_allowlist_and_the_named_variables_only():
    """pyxis's suite (entrypoint.bats): a job's DOCKER_TLS_VERIFY reaches docker's entrypoint only
    when named in --container-env; the rest of the job's variables reach the command."""
    passed = passed_from_host(HOST, spec())
    assert entrypoint_split(passed, spec()) == (passed, {})            # no entrypoint: all at once
    first, later = entrypoint_split(passed, spec(entrypoint=True, env_names=("OTHER",)))
    assert later == {"MYVAR": HOST["MYVAR"]}
    assert first["OTHER"] == "no" and {"RANK", "SLURM_JOB_ID", "PMIX_RANK", "CUDA_VISIBLE_DEVICES"} <= set(first)
    assert set(first) | set(later) == set(passed) and not set(first) & set(later)


def test_after_the_entrypoint_the_jobs_variables_fill_only_what_it_left_unset(tmp_path):
    """The chain as a container runs it: an entrypoint that derives one variable from another and
    sets a third, then LATER_PART (the shell between it and the command) sourcing the job's values
    -- any bytes but NUL, nothing in them run -- from one file, read once; an entrypoint that became
    another user (gosu), or a mount over the directory, is said."""
    rank_dir = tmp_path / "rank-3"
    later = {"DOCKER_TLS_VERIFY": "1", "SET_BY_ENTRYPOINT": "job", "IMAGE_ENV": "job", "NL": "a\nb\n",
             "ODD": "it's $(touch pwned) `x` \\ \"q\"\n", "EMPTY": "", "_tether_v": "kept", "f": "kept"}
    inside = later_values(str(rank_dir), later)
    script = rank_dir / "work" / LATER_FILE
    assert inside == f"{CONTAINER_WORKDIR}/{LATER_FILE}" and oct(script.stat().st_mode & 0o777) == "0o600"
    entry = ('if [ -n "$DOCKER_TLS_VERIFY" ]; then export DOCKER_HOST=tcp://docker:2376; '
             'else export DOCKER_HOST=tcp://docker:2375; fi; export SET_BY_ENTRYPOINT=entry; exec "$@"')
    show = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    names = ["DOCKER_HOST", "DOCKER_TLS_VERIFY", "SET_BY_ENTRYPOINT", "IMAGE_ENV", "NL", "ODD", "EMPTY",
             "_tether_v", "f", "RANK"]
    for shell in ("sh", "bash"):                  # dash, and bash as an image's /bin/sh may be
        script.write_text(later_script(later))
        ran = subprocess.run([shell, "-c", entry, "entrypoint", shell, "-c", LATER_PART + 'exec "$@"', "sh",
                              str(script), sys.executable, "-c", show, *names],
                             env={"PATH": os.environ["PATH"], "IMAGE_ENV": "image", "RANK": "3"},
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert json.loads(ran.stdout) == {**later, "DOCKER_HOST": "tcp://docker:2375", "SET_BY_ENTRYPOINT": "entry",
                                          "IMAGE_ENV": "image", "RANK": "3"}, (shell, ran.stderr)
        assert not script.exists() and not (tmp_path / "pwned").exists()          # read once; nothing run
    script.write_text(later_script({"X": "y"}))
    script.chmod(0o000)                           # as another user than its owner sees it
    unreadable = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                 LATER_PART + 'echo "${X-unset}"', "sh", str(script)],
                                capture_output=True, text=True, timeout=60)
    assert unreadable.stdout == "unset\n" and "or the entrypoint became another user" in unreadable.stderr
    covered = subprocess.run(["sh", "-c", LATER_PART + "true", "sh", str(tmp_path / "none")], capture_output=True,
                             text=True, timeout=60)
    assert covered.returncode == 0 and "(a mount covers it" in covered.stderr


def test_a_fifo_or_link_where_the_variables_file_belongs_fails_the_rank_at_once(tmp_path):
    """The rank's work directory is the user's: a FIFO planted at .tether-later.sh (no reader) hung
    the launcher in open(); a symlink there is not followed. Both: a clear error, at once."""
    from tether.container.spec import LaunchError

    (tmp_path / "work").mkdir()
    os.mkfifo(tmp_path / "work" / LATER_FILE)
    started = time.monotonic()
    with pytest.raises(LaunchError, match="cannot write file of the variables for after the entrypoint .*"
                                          "No such device or address"):
        later_values(str(tmp_path), {"A": "b"})
    assert time.monotonic() - started < 10
    (tmp_path / "work" / LATER_FILE).unlink()
    (tmp_path / "work" / LATER_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchError, match="Too many levels of symbolic links"):
        later_values(str(tmp_path), {"A": "b"})
    assert not (tmp_path / "elsewhere").exists()

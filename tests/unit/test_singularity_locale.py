"""SingularityCE 3.4 and the job's locale (issue 45, "also seen": LANG always arrived as C). The
strict fake replays what the real 3.4.2 did with LANG and LC_ALL (the conformance cases, copied in
tests/fixtures/conformance/singularity-3.4-locale.json), and tether's launch gives a 3.4 container
the job's locale through the LC_* variables it does take."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import REPO
from tether.container.runtimes import adapter
from tether.container.spec import spec_from_env

CASES = json.loads((REPO / "tests/fixtures/conformance/singularity-3.4-locale.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_fake_singularity_34_does_what_the_real_one_did(case, fake_runtimes, tmp_path):
    fake_runtimes.configure(profiles={"singularity": "singularity-3.4"}, run=True)
    (tmp_path / "bb.sif").write_text("")
    env = {k: v.replace("<HOME>", str(tmp_path)) for k, v in case["env"].items()}
    env["PATH"] = fake_runtimes.path_env()
    result = subprocess.run(case["argv"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (case["exit_code"], case["stdout"]), result.stderr


def test_a_34_container_gets_the_jobs_locale_in_each_category_it_does_not_set(fake_runtimes, tmp_path):
    fake_runtimes.configure(profiles={"singularity": "singularity-3.4"}, run=True)
    image = tmp_path / "app.sif"
    image.write_text("")
    probe = 'echo "LANG=$LANG LC_ALL=${LC_ALL-unset} LC_CTYPE=$LC_CTYPE LC_TIME=$LC_TIME LC_NUMERIC=$LC_NUMERIC"'
    host = {"PATH": fake_runtimes.path_env(), "HOME": str(tmp_path), "LANG": "de_DE.UTF-8", "LC_NUMERIC": "C"}
    singularity = adapter("singularity", {"binary": str(fake_runtimes.bin_dir / "singularity")})
    # the job's LANG stays out unless named (as pyxis: env.bats "$LANG special case"), on 3.4 too
    plain = spec_from_env({"TETHER_CONTAINER_IMAGE": str(image), "SLURM_JOB_ID": "7"}, ["true"],
                          default_runtime="singularity")
    assert not [k for k in singularity.launch(plain, host).env if k.startswith("SINGULARITYENV_LANG")
                or k.startswith("SINGULARITYENV_LC_") and k != "SINGULARITYENV_LC_NUMERIC"]
    spec = spec_from_env({"TETHER_CONTAINER_IMAGE": str(image), "SLURM_JOB_ID": "7",
                          "TETHER_CONTAINER_ENV": "LANG,LC_ALL"}, ["sh", "-c", probe], default_runtime="singularity")
    launch = singularity.launch(spec, host)
    out = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    # LANG itself reads C (3.4 forces it), but every category is the job's -- its own LC_NUMERIC kept
    assert out.stdout == "LANG=C LC_ALL=unset LC_CTYPE=de_DE.UTF-8 LC_TIME=de_DE.UTF-8 LC_NUMERIC=C\n", out.stderr
    with_all = {**host, "LC_ALL": "fr_FR.UTF-8"}        # LC_ALL decides everything: nothing added
    launch = singularity.launch(spec, with_all)
    assert sorted(k for k in launch.env if k.startswith("SINGULARITYENV_LC_")) == [
        "SINGULARITYENV_LC_ALL", "SINGULARITYENV_LC_NUMERIC"]        # the job's own, as they were
    apptainer = adapter("apptainer", {"binary": str(fake_runtimes.bin_dir / "apptainer")}).launch(spec, host)
    assert "APPTAINERENV_LC_CTYPE" not in apptainer.env          # only Singularity forces LANG

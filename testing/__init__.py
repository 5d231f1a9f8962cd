"""tether's testing kit: stand-ins for what a site cannot run in its tests, and a pytest plugin.

Installed with tether; pytest loads its plugin (tether.testing.plugin) through the ``pytest11``
entry point named ``tether.testing`` (or ``pytest -p tether.testing``). It gives a site's own test suite -- and tether's -- these fixtures:

``tether_site_config``  the ``tether.yaml`` under test: the one beside the test file, else the one
                        in pytest's root directory, else ``$TETHER_CONFIG``, else None (tether's
                        defaults)
``fake_slurm``          a stateful fake Slurm 22.05 whose sbatch/srun run tether's job_submit handler
                        with that config (tether.testing.slurm.FakeSlurm)
``fake_pbs``            a stateful fake OpenPBS whose qsub runs tether's submit hook
                        (tether.testing.pbs.FakePbs)
``fake_runtimes``       strict fake apptainer/singularity/enroot (tether.testing.runtimes.FakeRuntimes);
                        on the PATH of fake_slurm's and fake_pbs's commands in the same test
``pbs_stub``            the stand-in ``pbs`` module, for running hook files yourself
                        (tether.testing.pbs.run_hook)

A site's test, complete::

    def test_eight_gpu_slots_take_two_nodes(fake_slurm, tmp_path):
        (tmp_path / "job.sh").write_text("#!/bin/sh\\n#SBATCH --slots=8 --slots-per-node=4\\nhostname\\n")
        job = fake_slurm.job(fake_slurm.sbatch(str(tmp_path / "job.sh")))
        assert (job["min_nodes"], job["tres_per_node"]) == (2, "gres:gpu:4")

Every fake refuses an option the real program does not know, with the real program's message.
"""

from __future__ import annotations

from typing import Any

# The names below are imported on first use: the fake commands import their own module from this
# package on every call, and must not pay for (or need) pytest.
_EXPORTS = {"PBS_MODULE_DIR": "pbs", "FakePbs": "pbs", "ServerInterpreter": "pbs", "pbs_module": "pbs",
            "run_hook": "pbs", "FakeRuntimes": "runtimes", "FakeSlurm": "slurm", "SubmissionRefused": "slurm"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tether.testing' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)

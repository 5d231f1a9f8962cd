"""Singularity (SingularityCE 3.x / 4.x): the Apptainer adapter with Singularity's names."""

from __future__ import annotations

from .apptainer import Apptainer


class Singularity(Apptainer):
    name = "singularity"
    env_prefix = "SINGULARITYENV_"


ADAPTER = Singularity

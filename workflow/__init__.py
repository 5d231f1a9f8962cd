"""Workflow packs (docs/requirements.md): jobs whose starts are delayed relative to the first job's start, so
producer and consumer overlap, and the running job's power to move its dependents (release them
early, change their dependency type). Python API: ``submit_pack``, ``release``, ``set_dependency``,
``pack_status`` (tether.workflow.pack)."""

from .pack import DEPENDENCY_TYPES, PackError, pack_status, parse_pack, release, set_dependency, submit_pack

__all__ = ["DEPENDENCY_TYPES", "PackError", "pack_status", "parse_pack", "release", "set_dependency", "submit_pack"]

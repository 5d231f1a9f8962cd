"""Reading PBS job attributes the way the real ``pbs`` module gives them, for both hook sides.

OpenPBS src/modules/python/pbs/v1/_base_types.py, ``pbs_resource``: ``Resource_List[name]`` is
``getattr(self, name)``; a resource the server does not define raises AttributeError (a stock server
has no ``ngpus`` until an admin creates it), one it defines but the job did not ask for is None.
``Variable_List`` and a task's ``e.env`` are mappings without that resource's name.
"""

from __future__ import annotations

from typing import Any


def resource(resource_list: Any, name: str) -> Any:
    """A job's resource value, or None when it is unset -- or not defined on this server at all."""
    if resource_list is None:
        return None
    try:
        return resource_list[name]
    except (AttributeError, KeyError):
        return None


def variable(mapping: Any, name: str) -> Any:
    """``mapping[name]`` (a job's variables, a task's environment), or None when absent."""
    try:
        return mapping[name]
    except (KeyError, TypeError):
        return None

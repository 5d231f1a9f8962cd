"""Error types shared by every tether component.

``TetherError`` messages are written for the person who must act on them: a user sees a
``RequestError`` from sbatch/qsub/``tether plan``; an admin sees a ``ConfigError`` from
``tether config check`` or in the daemon's log.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Iterable


class TetherError(Exception):
    """Base class: ``str(err)`` is the complete, user-facing message."""


class RequestError(TetherError):
    """A job request tether cannot plan (bad numbers, conflicting options, ...)."""


class ConfigError(TetherError):
    """One or more problems in a configuration file, all reported at once."""

    def __init__(self, source: str, problems: Iterable[object]):
        self.source = source
        self.problems = [str(p) for p in problems]
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))

"""Slurm's hostlist syntax (``n[1-3,5],rack[1-2]n[01-04]``) expanded into names, in Python alone
(inside slurmctld there is no ``scontrol show hostnames`` to ask)."""

from __future__ import annotations

import re

_PART = re.compile(r"(?:[^,\[]|\[[^\]]*\])+")     # a name: up to a comma outside brackets
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_hostlist(text: str, *, limit: int = 1_000_000) -> list[str]:
    """``n[1-3,5],m1`` -> ``[n1, n2, n3, n5, m1]``; every bracket of a name expanded (``r[1-2]n[1-2]``
    is four names), numbers keep the width of their range's first bound (``n[01-03]``). A range
    that is not numbers raises ValueError, as does a list of more than ``limit`` names."""
    hosts: list[str] = []
    for part in _PART.findall(text.strip()):
        pieces = re.split(r"\[([^\]]*)\]", part)      # literal, ranges, literal, ranges, ..., literal
        names = [pieces[0]]
        for ranges, literal in zip(pieces[1::2], pieces[2::2]):
            numbers = []
            for item in ranges.split(","):
                m = _RANGE.fullmatch(item.strip())
                if not m:
                    raise ValueError(f"{part}: {item!r} is not a number or a range of numbers")
                lo, hi = m.group(1), m.group(2) or m.group(1)
                if int(hi) < int(lo) or int(hi) - int(lo) > limit:
                    raise ValueError(f"{part}: {item!r} is not a range Slurm takes")
                numbers += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
            if len(hosts) + len(names) * len(numbers) > limit:      # before the product is built
                raise ValueError(f"more than {limit} names")
            names = [n + x + literal for n in names for x in numbers]
        hosts += names
    return hosts

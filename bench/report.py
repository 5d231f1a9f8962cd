#!/usr/bin/env python3
"""Write the README's performance table from the figures the benchmarks of one `make bench` run
recorded (bench/summary.py): ``python bench/report.py SUMMARY.jsonl README.md``. The table goes
between the ``<!-- bench:start -->`` and ``<!-- bench:end -->`` lines; the rest of the README is
left as it is."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, with the run's date and machine."""
    lines = [f"Measured by `make bench` on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} cores, Linux "
             f"{platform.release()}; each ratio is the median of per-round ratios of interleaved rounds in "
             f"one run, quartiles in brackets. {load_note()}", "",
             "| benchmark | figure | this run | goal | met |", "|---|---|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "**no**", None: ""}[r.get("met")]
        lines.append(f"| `{r['bench']}` | {r['figure']} | {r['value']} | {r.get('goal') or ''} | {met} |")
    return "\n".join(lines)


def load_note() -> str:
    """How busy the machine was as the run ended (its 15-minute load average): with more runnable
    processes than cores, other work shared the machine -- absolute times stretch, while the ratios
    of interleaved rounds hold better."""
    load, cores = os.getloadavg()[2], os.cpu_count() or 1
    shared = (": other work shared the machine (absolute times stretch; ratios of interleaved rounds "
              "hold better)" if load > cores else "")
    return f"Load average over the run's last 15 minutes: {load:.1f}{shared}."


def replace_block(text: str, block: str) -> str:
    """``text`` with the lines between the markers replaced by ``block``."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"the README has no {START} ... {END} block")
    return f"{head}{START}\n{block}\n{END}{tail}"


def main(argv: list[str]) -> int:
    summary, readme = Path(argv[1]), Path(argv[2])
    rows = [json.loads(line) for line in summary.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{summary}: no figures recorded")
    readme.write_text(replace_block(readme.read_text(), table(rows)))
    print(f"{readme}: the performance table now holds {len(rows)} figures from {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""The docs stay true: what the code cites is in the repository (issue 42), and docs/requirements.md's
resource tables are what hooks/plan.py does."""

from __future__ import annotations

import ast
import os
import re

import pytest

from tether.hooks.plan import PBS_TABLE, SLURM_TABLE, make_plan
from tether.hooks.render import resource_options
from tether.hooks.request import Request

from helpers import REPO, make_config

REQUIREMENTS = (REPO / "docs" / "requirements.md").read_text()
SKIPPED_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}

# What the code once cited from outside the repository (spelt in pieces, so this file does not
# match): the design notes beside the checkout, and the numbered documents the product was
# specified from. Their content is docs/requirements.md's now.
OUTSIDE = [re.compile(re.escape("../" + "shared/")), re.compile(re.escape("DESIGN" + ".md")),
           re.compile(r"\bseed \d{3}", re.I)]


def repository_texts() -> dict[str, str]:
    """Every file of the checkout but build outputs and caches, as text."""
    texts = {}
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in names:
            if name in SKIPPED_DIRS or name.endswith((".so", ".o", ".pyc")):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                texts[os.path.relpath(path, REPO)] = f.read().decode("utf-8", "replace")
    return texts


TEXTS = repository_texts()


def test_nothing_cites_what_is_not_in_the_repository():
    found = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for path, text in sorted(TEXTS.items()) for pattern in OUTSIDE for m in pattern.finditer(text)]
    assert not found, "cite docs/requirements.md and its section instead:\n" + "\n".join(found)


def headings(text: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{2,4} (.+)$", text, re.M)}


def cited_sections() -> list[tuple[str, str]]:
    """(file, section) for every citation of docs/requirements.md followed by a comma and a section
    name in double quotes; a name wrapped over lines (a comment's ``#``, `` * `` or ``--`` in front)
    is joined again."""
    cites = []
    for path, text in TEXTS.items():
        for m in re.finditer(r'docs/requirements\.md, "([^"]+)"', text):
            cites.append((path, re.sub(r"\s*\n\s*(?:#|\*|--)?\s*", " ", m.group(1)).strip()))
    return cites


def test_citations_name_sections_of_the_requirements():
    cites = cited_sections()
    assert len(cites) >= 20
    missing = sorted({f"{path}: {section!r}" for path, section in cites if section not in headings(REQUIREMENTS)})
    assert not missing, "docs/requirements.md has no such section:\n" + "\n".join(missing)


# ---- the resource tables, row by row, against the planner -----------------------------------------
def table_rows(section: str) -> list[list[str]]:
    """The cells of every table row in a section of docs/requirements.md (its tables only)."""
    body = REQUIREMENTS.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---") and not line.startswith("| slot type"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def flags(cell: str) -> list[bool]:
    return {"true": [True], "false": [False], "n/a": [True, False], "any": [True, False]}[cell]


def slot_cases(cell: str) -> list[tuple[str, int]]:
    """(slot type, slots) a row's first cell stands for; ``any, 0 slots`` is the aux row."""
    if cell == "any, 0 slots":
        return [(t, 0) for t in ("cuda", "rocm", "cpu")]
    return [(t.strip(), 8) for t in cell.split(",")]


def expected_options(cell: str, gpu_type: str | None) -> list[tuple[str, str]]:
    """A row's options with the request's numbers put in: 8 slots, 4 per node, so 2 nodes."""
    out = []
    for option in re.findall(r"`([^`]+)`", cell):
        option = (option.replace("[gpu_type:]", f"{gpu_type}:" if gpu_type else "")
                  .replace("[:gpu_type]", f":{gpu_type}" if gpu_type else "")
                  .replace("slots_per_trial/slots_per_node", "2")
                  .replace("slots_per_trial", "8").replace("slots_per_node", "4"))
        name, value = option.split(" ", 1) if option.startswith("-l ") else option.split("=", 1)
        out.append((name, value))
    return out


def slurm_cases():
    for cells in table_rows("Slurm resource calculations"):
        slot_cell, tres_cell, gres_cell, options_cell = cells[:4]
        for slot_type, slots in slot_cases(slot_cell):
            for tres in flags(tres_cell):
                for gres in flags(gres_cell):
                    gpu_types = (None, "a100") if slot_type != "cpu" and slots else (None,)
                    for gpu_type in gpu_types:
                        yield pytest.param(slot_type, slots, tres, gres, gpu_type, options_cell,
                                           id=f"{slot_type}-{slots}-tres={tres}-gres={gres}-{gpu_type}")


def pbs_cases():
    for cells in table_rows("PBS resource calculations"):
        slot_cell, gres_cell, options_cell = cells[:3]
        for slot_type, slots in slot_cases(slot_cell):
            for gres in flags(gres_cell):
                yield pytest.param(slot_type, slots, gres, options_cell, id=f"{slot_type}-{slots}-gres={gres}")


def plan_for(scheduler: str, slot_type: str, slots: int, gpu_type: str | None = None, **config):
    request = Request(slots=slots, slots_per_node=4 if slots else None, slot_type=slot_type, gpu_type=gpu_type)
    return make_plan(request, make_config(**config), scheduler)


@pytest.mark.parametrize("slot_type,slots,tres,gres,gpu_type,options_cell", list(slurm_cases()))
def test_slurm_table_row_is_what_the_plan_asks_for(slot_type, slots, tres, gres, gpu_type, options_cell):
    plan = plan_for("slurm", slot_type, slots, gpu_type, tres_supported=tres, gres_supported=gres)
    assert resource_options(plan) == expected_options(options_cell, gpu_type)


@pytest.mark.parametrize("slot_type,slots,gres,options_cell", list(pbs_cases()))
def test_pbs_table_row_is_what_the_plan_asks_for(slot_type, slots, gres, options_cell):
    plan = plan_for("pbs", slot_type, slots, gres_supported=gres)
    # every PBS request also gets place=scatter (one chunk per host), as the section says
    assert resource_options(plan) == expected_options(options_cell, None) + [("-l", "place=scatter")]


def test_the_tables_cover_every_row_of_the_plan():
    slurm = {plan_for("slurm", p.values[0], p.values[1], p.values[4], tres_supported=p.values[2],
                      gres_supported=p.values[3]).row for p in slurm_cases()}
    pbs = {plan_for("pbs", p.values[0], p.values[1], gres_supported=p.values[2]).row for p in pbs_cases()}
    assert slurm == {row.key for row in SLURM_TABLE}
    assert pbs == {row.key for row in PBS_TABLE}


# ---- docs/architecture.md's floors against the imports ---------------------------------------------
def floors() -> dict[str, int]:
    """Folder -> floor (0 at the top) from the picture at the head of docs/architecture.md."""
    picture = (REPO / "docs" / "architecture.md").read_text().split("```\n", 2)[1]
    return {folder.strip(): floor for floor, line in enumerate(picture.splitlines())
            for folder in line.split("(", 1)[0].split("·")}


def imported_folders(folder: str, folders: set[str]) -> dict[str, str]:
    """The other folders ``folder``'s code uses -> one file that does: Python imports (relative or
    ``tether.``), and C's ``#include "x.h"`` of a header that one other folder alone has."""
    headers: dict[str, set[str]] = {}
    for path in TEXTS:
        if path.endswith(".h") and path.split(os.sep)[0] in folders:
            headers.setdefault(os.path.basename(path), set()).add(path.split(os.sep)[0])
    used: dict[str, str] = {}
    for path, text in TEXTS.items():
        parts = path.split(os.sep)
        if parts[0] != folder:
            continue
        targets = []
        if path.endswith(".py"):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = parts[:-1][:len(parts) - node.level]
                    targets.append((base + (node.module or "").split("."))[0])
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether."):
                    targets.append(node.module.split(".")[1])
                elif isinstance(node, ast.Import):
                    targets += [a.name.split(".")[1] for a in node.names if a.name.startswith("tether.")]
        elif path.endswith((".c", ".h")):
            for name in re.findall(r'^#include "([^"]+)"', text, re.M):
                owners = headers.get(name, set()) - {folder}
                if folder not in headers.get(name, set()) and len(owners) == 1:
                    targets.append(owners.pop())
        for target in targets:
            if target in folders and target != folder:
                used.setdefault(target, path)
    return used


def test_the_architecture_floors_hold():
    """A folder imports only folders on lower floors of the picture, and every package is in it."""
    floor = floors()
    packages = {p.split(os.sep)[0] for p in TEXTS if p.endswith("__init__.py") and p.count(os.sep) == 1}
    assert packages <= set(floor), f"not in docs/architecture.md's picture: {sorted(packages - set(floor))}"
    wrong = [f"{user} ({path}) uses {used}, which is not on a lower floor"
             for user in floor for used, path in imported_folders(user, set(floor)).items()
             if floor[used] <= floor[user]]
    assert not wrong, "\n".join(wrong)


def test_c_reaches_no_other_components_folder():
    """Issue 42: C that more than one component compiles lives in native/, below them all; a C file
    includes only headers of its own folder or native's -- none reached sideways in another
    component's folder (job_submit's cache once took the image grammar and the names header from the
    SPANK plugin's folder)."""
    holders: dict[str, set[str]] = {}
    for path in TEXTS:
        if path.endswith(".h") and not path.startswith("tests" + os.sep):
            holders.setdefault(os.path.basename(path), set()).add(path.split(os.sep)[0])
    assert holders["tether_names.h"] == holders["imageref.h"] == holders["jobdirs.h"] == {"native"}
    wrong = [f"{path} includes {name} of {sorted(holders[name])}"
             for path, text in sorted(TEXTS.items())
             if path.endswith((".c", ".h")) and not path.startswith("tests" + os.sep)
             for name in re.findall(r'^#include "([^"]+)"', text, re.M)
             if holders.get(name) and not holders[name] & {path.split(os.sep)[0], "native"}]
    assert not wrong, "\n".join(wrong)

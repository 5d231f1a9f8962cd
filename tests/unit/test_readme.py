"""The README stays true: its `tether plan` examples and its configuration table are checked."""

from __future__ import annotations

import fnmatch
import json
import re
import os
import shlex
import sys
from pathlib import Path

import pytest

from tether.cli.main import main
from tether.hooks.config import config_reference
from tether.hooks.surface import options_reference

from helpers import REPO

README = (REPO / "README.md").read_text()


def fenced_after(marker: str) -> list[tuple[str, str]]:
    """(marker argument, following fenced block) for every ``<!-- marker: ... -->`` in the README."""
    pattern = re.compile(rf"<!-- {marker}: (.+?) -->\n```[a-z]*\n(.*?)```", re.S)
    return pattern.findall(README)


SPECS = dict(fenced_after("example-spec"))
RUNS = fenced_after("example-run")


def test_readme_has_examples():
    assert len(SPECS) >= 2 and len(RUNS) >= 3


@pytest.mark.parametrize("command,expected", RUNS, ids=[c for c, _ in RUNS])
def test_readme_plan_examples(command, expected, tmp_path, capsys, monkeypatch):
    for name, text in SPECS.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TETHER_CONFIG", raising=False)
    monkeypatch.setattr("tether.hooks.configfile.DEFAULT_CONFIG_PATH", str(tmp_path / "none.yaml"))
    argv = shlex.split(command)
    assert argv[0] == "tether"
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out == expected


def test_readme_invalid_example(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("slots_per_trial: 8\nslurm: {slots_per_node: 3}\n")
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"`{err}`" in README.replace("\n", " ")


def marked(name: str) -> str:
    return README.split(f"<!-- {name}:start -->\n")[1].split(f"<!-- {name}:end -->")[0]


def test_readme_config_reference_is_current():
    assert marked("config-reference") == config_reference()


def test_readme_options_reference_is_current():
    assert marked("options-reference") == options_reference()


def test_readme_test_command_is_what_ci_runs():
    section = README.split("## Run the tests")[1]
    command = re.search(r"`([^`]+)`", section).group(1)
    assert command == "make test"
    assert command in (REPO / ".ci" / "run").read_text()


def test_readme_pbs_install_commands_are_what_tether_prints():
    """The README's qmgr lines are what `tether pbs install` prints where `make install` put tether
    (tools/install's default venv): the hook files' paths are this installation's, moved to that
    venv -- the same place below the venv, whichever venv runs the tests."""
    import tether.admin.pbs
    from tether.admin.pbs import qmgr_commands

    block = README.split("### The PBS hooks")[1].split("```")[3]
    venv = re.search(r"^venv=\$\{TETHER_VENV:-(/\S+)\}$", (REPO / "tools" / "install").read_text(), re.M).group(1)
    site = Path(tether.admin.pbs.__file__).parents[2]           # site-packages/tether/admin/pbs.py
    installed = Path(venv) / site.relative_to(sys.prefix)
    printed = [f"qmgr -c {shlex.quote(cmd.replace(f' {site}/', f' {installed}/'))}"
               for cmd in qmgr_commands(Path("/etc/tether"))]
    assert [line for line in block.splitlines() if line.startswith("qmgr")] == printed


def test_readme_pbs_admin_commands_run_as_written(tmp_path):
    """Issue 40, 5: every qmgr command of the README's PBS section, the GPU steps included (in the
    notes, with a vnode put in), in order, against the fake qmgr of a stock server -- which refuses
    `set node ... resources_available.ngpus` before ngpus exists ("Unknown resource"), as the real
    one did when the README said only that."""
    from tether.testing.pbs import FakePbs

    section = README.split("### The PBS hooks")[1].split("\n## ")[0]
    commands = [m.group(2).replace("<vnode>", "n1")
                for m in re.finditer(r"qmgr -c (['\"])(.+?)\1", section)]
    assert any("resources_available.ngpus" in c for c in commands), commands
    fake = FakePbs(tmp_path / "pbs", custom_resources={})
    (tmp_path / "opt").mkdir()
    for command in commands:
        for path in re.findall(r"default (/\S+)", command):          # the files install writes
            target = tmp_path / "opt" / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("{}\n")
            command = command.replace(path, str(target))
        result = fake.run("qmgr", "-c", command)
        assert result.returncode == 0, (command, result.stderr)
    nodes = json.loads(fake.run("pbsnodes", "-a", "-F", "json").stdout)["nodes"]
    assert nodes["n1"]["resources_available"]["ngpus"] == 4


def test_readme_tables_are_current():
    """Every marked table (options, config, container environment, rank environment) is what
    `make generated` would write now."""
    sys.path.insert(0, str(REPO / "tools"))
    from regenerate import readme_with_tables

    assert readme_with_tables(README) == README, "run `make generated`"


IGNORED_DIRS = {".git", "__pycache__", "build", "dist", ".pytest_cache", ".hypothesis"}   # .gitignore


def repository_files() -> list[str]:
    """The checkout's files (a CI checkout may have no .git): what .gitignore does not exclude."""
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info")]
        # .git is a file in a git worktree
        files += [os.path.relpath(os.path.join(root, n), REPO) for n in names
                  if not n.endswith((".so", ".o", ".pyc")) and n != ".git"]
    return files


def test_the_file_map_names_every_file_of_the_repository():
    """docs/architecture.md maps every tracked file, and nothing that is not there."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    rows = doc.split("<!-- file-map:start -->\n")[1].split("<!-- file-map:end -->")[0].splitlines()[2:]
    patterns = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]
    tracked = repository_files()
    unmapped = [f for f in tracked if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    stale = [p for p in patterns if not any(fnmatch.fnmatch(f, p) for f in tracked)]
    assert not unmapped, f"files missing from docs/architecture.md: {unmapped}"
    assert not stale, f"docs/architecture.md names files that do not exist: {stale}"


def readme_commands(program: str) -> list[str]:
    """Every ``program …`` command line in the README's fenced blocks (continuations joined)."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith(f"{program} ") and "--slots" in line:
                lines.append(line)
    return lines


@pytest.mark.parametrize("command", readme_commands("sbatch") + readme_commands("srun"))
def test_readme_slot_commands_are_accepted(command, fake_slurm):
    """Issue 15: the README's own `sbatch -N3 --slots=6 --slots-per-node=2 …` was refused ("--nodes=3
    conflicts with --nodes"). Each slot command line of the README goes through tether's real
    job_submit handler (the testing kit's sbatch) and must be accepted."""
    words = shlex.split(command)[1:]
    options = []
    for word in words:
        if not word.startswith("-"):
            break
        options.append(word)
    fake_slurm.sbatch(*options, "--wrap", "true")


def readme_pack_jobs() -> list[tuple[str, list[str]]]:
    """(job name, sbatch_args) of every workflow pack in the README's YAML blocks."""
    import yaml

    found = []
    for block in re.findall(r"```yaml\n(.*?)```", README, re.S):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and isinstance(doc.get("jobs"), list):
            found += [(job.get("name", "?"), job.get("sbatch_args") or []) for job in doc["jobs"]]
    return found


@pytest.mark.parametrize("name,args", readme_pack_jobs())
def test_readme_pack_jobs_are_accepted(name, args, fake_slurm):
    """The README's pack (`sbatch_args: [-N4, --slots=16, ...]`) was refused at submit: tether plans
    the nodes from the slots (issue 45). Each job's options go through the real handler."""
    fake_slurm.sbatch(*args, "--wrap", "true")


def test_readme_has_slot_commands():
    assert readme_pack_jobs()
    assert len(readme_commands("sbatch")) >= 3


def test_every_test_security_md_names_exists():
    """SECURITY.md's table of what root touches names a test per row: each one must be a test
    function in that file (a renamed or removed test would leave a row unguarded)."""
    text = (REPO / "SECURITY.md").read_text()
    table = text.split("### Every path and input root touches, and its test", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| path")]
    assert len(rows) >= 10
    for row in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.rsplit("|", 2)[-2])
        assert named, f"a row of SECURITY.md's table names no test: {row[:80]}"
    for path, name in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text):       # every table's
        source = (REPO / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"SECURITY.md names {path}::{name}, which is not there"


def test_the_sandbox_installs_the_plugins_with_the_readmes_admin_commands(tmp_path):
    """Issue 46, item 5: the sandbox's nodes get tether the way the README's admin section says
    ("The Slurm plugins"), command for command, only pointed at the sandbox's own build directory,
    slurm.conf and PluginDir -- so every cluster run runs the README's steps."""
    from tether.sandbox.cluster import Sandbox

    block = README.split("### The Slurm plugins")[1].split("```")[1]
    readme = [shlex.split(line.split("  #", 1)[0].removeprefix("sudo ")) for line in block.splitlines()
              if line.startswith("sudo tether ")]
    readme = [argv for argv in readme if argv != ["tether", "slurm", "install"]]   # the dry run: says, changes nothing
    placement = {"--out", "--build-dir", "--slurm-conf", "--plugin-dir"}          # where, not what
    ran = []
    for argv in Sandbox(tmp_path).admin_commands():
        flags = [a for a in argv if a.startswith("--")]
        kept = [a for i, a in enumerate(argv) if a not in placement and (i == 0 or argv[i - 1] not in placement)]
        assert set(flags) - placement <= set(kept), argv
        ran.append(kept)
    assert ran == readme and len(readme) == 2, (ran, readme)


def test_a_release_sandbox_installs_tether_from_its_package_with_the_readmes_commands(tmp_path):
    """Issues 41 and 46: a sandbox on another Slurm release installs tether in its root from the
    package built for that release, with the README's package steps ("**Install** on every host"),
    in their order -- pointed at its own slurm.conf only."""
    from tether.sandbox.cluster import Sandbox

    block = README.split("**Install** on every host:")[1].split("```")[1]
    deb = tmp_path / "tether-slurm24.11_0.1.0-1_amd64.deb"
    deb.write_bytes(b"!<arch>\n")
    box = Sandbox(tmp_path / "box", slurm="24.11", package=deb)
    commands = [box.package_command(f"/var/tmp/tether-package/{deb.name}"), *box.admin_commands()]
    assert commands[0][:2] == ["dpkg", "-i"] and len(commands) == 3
    placement = {"--slurm-conf"}
    at = -1
    for argv in commands:
        kept = [a for i, a in enumerate(argv) if a not in placement and (i == 0 or argv[i - 1] not in placement)]
        text = re.sub(r"\S*tether-slurm[\d.]+_[^ ]+\.deb", "tether-slurm<R>_<version>_amd64.deb", " ".join(kept))
        lines = [re.sub(r"tether-slurm[\d.]+_<version>_amd64\.deb", "tether-slurm<R>_<version>_amd64.deb", line)
                 for line in block.splitlines()]
        found = [i for i, line in enumerate(lines) if line.startswith(text + " ") or f"installed: {text}" in line]
        assert found and found[0] > at, (text, block)
        at = found[0]
    with pytest.raises(Exception, match="not a .deb file"):
        Sandbox(tmp_path / "box", slurm="24.11", package=tmp_path)

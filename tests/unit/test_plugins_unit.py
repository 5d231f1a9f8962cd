"""The plugins' pure parts: the names table and its C header, each C unit compiled on its own,
reading spank_job_env, build/install helpers."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tether.admin.slurm import SlurmConf
from tether.hooks.surface import BY_NAME, OPTIONS, PBS_RESOURCES
from tether.job_submit import build as job_submit_build
from tether.job_submit.handler import _on_failure_of_broken, gres_prefix, tether_values
from tether.native.build import names_header
from tether.system import toolchain
from tether.system.files import set_conf_line, world_readable
from tether.system.toolchain import BuildError, cflags

from helpers import REPO


def test_option_names_and_environment():
    opt = BY_NAME["slots-per-node"]
    assert (opt.env, opt.spank_env, opt.job_env, opt.pbs_resource) == (
        "TETHER_SLOTS_PER_NODE", "_SLURM_SPANK_OPTION_tether_slots_per_node", "TETHER_JOB_SLOTS_PER_NODE",
        "tether_slots_per_node")
    assert [o.name for o in OPTIONS][:5] == ["slots", "slots-per-node", "slot-type", "gpu-type",
                                             "resource-pool"]
    # the PBS hook files recognise tether's resources by this prefix when tether cannot load
    assert all(opt.pbs_resource.startswith("tether_") for opt in PBS_RESOURCES)


def test_committed_names_header_is_generated_from_the_table():
    """native/tether_names.h is what names_header() writes (after a change: `make generated`)."""
    assert (REPO / "native" / "tether_names.h").read_text() == names_header()


C_UNITS = [*sorted((REPO / "native").glob("*.c")), *sorted((REPO / "spank").glob("*.c")),
           *sorted((REPO / "job_submit").glob("*.c")), REPO / "pbs_hooks" / "tether_jobdirs.c"]


@pytest.mark.parametrize("unit", C_UNITS, ids=[f"{u.parent.name}/{u.name}" for u in C_UNITS])
def test_each_c_unit_compiles_on_its_own(unit, tmp_path):
    include = ["-I/usr/include", f"-I{REPO / 'native'}", f"-I{sysconfig.get_paths()['include']}"]
    result = subprocess.run(["gcc", *cflags(), *include, "-c", str(unit), "-o", str(tmp_path / "unit.o")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_bridge_declarations_reach_cffi():
    cdef = job_submit_build.cdef()
    assert "typedef struct tether_job {" in cdef and "char out_wckey[...];" in cdef
    assert "void tether_log(int level, const char *msg);" in cdef and "/*" not in cdef
    assert job_submit_build.embedding_api().split() == (
        "int tether_py_init(void); int tether_py_submit(tether_job_t *job, uint32_t submit_uid, int wanted); "
        "int tether_py_modify(tether_job_t *update, tether_job_t *current, uint32_t submit_uid);").split()


def test_generated_c_option_table():
    table = names_header().split("#define TETHER_OPTION_TABLE")[1].split("\n\n")[0]
    assert table.count("{ \"") == len(OPTIONS)
    assert '{ "slots", "N", "[tether] slots for the job' in table
    assert '"TETHER_CONTAINER_WRITABLE", NULL, 0L, 0L, NULL, 0 }' in table
    assert '"container-writable", NULL,' in table          # a flag has no arginfo


def test_tether_values_prefers_the_forwarded_value():
    env = ["_SLURM_SPANK_OPTION_tether_slots=8", "TETHER_SLOTS=4", "OTHER=1",
           "_SLURM_SPANK_OPTION_tether_slots_per_node=2", "_SLURM_SPANK_OPTION_other_slots=9",
           "TETHER_GPU_TYPE=a100", "broken-entry"]
    assert tether_values(env) == {"slots": "4", "slots-per-node": "2", "gpu-type": "a100"}


def test_gres_spelling_by_version():
    assert gres_prefix(0x160508) == "gres:"          # 22.05.8, seen here
    # 24.11.5: docs/requirements.md, "Facts verified against real programs"
    assert gres_prefix(0x180b05) == "gres/"


@pytest.mark.parametrize("text,expected", [
    ("plugin: {on_failure: reject_all_jobs}\nslot_type: gpu\n", "reject_all_jobs"),
    ("plugin: {on_failure: nonsense}\n", None),
    ("plugin: [1]\n", None),
    ("not: [valid yaml\n", None),
])
def test_on_failure_is_read_from_a_broken_file(tmp_path, text, expected):
    path = tmp_path / "tether.yaml"
    path.write_text(text)
    assert _on_failure_of_broken(str(path)) == expected
    assert _on_failure_of_broken(str(tmp_path / "absent.yaml")) is None


def test_slurm_conf_settings(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# comment\npluginDir=/a:/b\njobsubmitplugins = lua,pbs\n")
    read = SlurmConf.read(conf)
    assert (read.plugin_dirs, read.job_submit_plugins, read.plugstack) == (
        ("/a", "/b"), ("lua", "pbs"), tmp_path / "plugstack.conf")
    with pytest.raises(BuildError, match="cannot read"):
        SlurmConf.read(tmp_path / "absent.conf")


def test_set_conf_line_replaces_appends_removes_and_keeps_the_mode(tmp_path):
    path = tmp_path / "slurm.conf"
    path.write_text("A=1\nJobSubmitPlugins=lua\nB=2\njobsubmitplugins=x\n")
    os.chmod(path, 0o640)
    set_conf_line(path, r"JobSubmitPlugins\s*=", "JobSubmitPlugins=lua,tether")
    assert path.read_text() == "A=1\nJobSubmitPlugins=lua,tether\nB=2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    set_conf_line(path, r"Other\s*=", "Other=3")
    assert path.read_text().endswith("B=2\nOther=3\n")
    set_conf_line(path, r"JobSubmitPlugins\s*=", None)
    assert "JobSubmitPlugins" not in path.read_text()


def test_world_readable():
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:     # /var/tmp: traversable by all
        d = Path(tmp)
        f = d / "f"
        f.write_text("x")
        os.chmod(d, 0o755)
        os.chmod(f, 0o644)
        assert world_readable(f)
        os.chmod(f, 0o600)
        assert not world_readable(f)
        os.chmod(f, 0o644)
        os.chmod(d, 0o700)
        assert not world_readable(f)


def test_missing_slurm_headers_are_named(monkeypatch):
    monkeypatch.setattr(toolchain, "SLURM_INCLUDE_DIRS", ("/nonexistent",))
    with pytest.raises(BuildError, match="install libslurm-dev"):
        toolchain.find_toolchain()


def test_toolchain_here_embeds_a_readable_python():
    found = toolchain.find_toolchain()
    assert found.slurm_version == "22.05.8" and found.slurm_version_number == 0x160508
    assert found.libpython.startswith("/usr/lib/") and world_readable(found.libpython)
    assert any(p.endswith("site-packages") for p in found.module_paths)


def test_the_handler_skips_its_stat_when_the_shim_vouches_for_the_config(tmp_path, monkeypatch):
    """A cold handler call costs a distinct job its time: when the answers cache checked the
    config file a moment ago (config_current), the handler does not stat() it again; otherwise it
    does, and a changed file is read."""
    from tether.job_submit import handler as handler_mod
    from tether.job_submit.handler import ACCEPT, Handler
    from tether.testing.slurm import PluginLib, bridge_ffi

    config = tmp_path / "tether.yaml"
    config.write_text("default_compute_resource_pool: gpu\n")
    ffi = bridge_ffi()
    h = Handler(ffi, PluginLib(), env={"TETHER_CONFIG": str(config)})
    assert h.init() == ACCEPT
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(handler_mod.os, "stat", lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k))
    entries = [ffi.new("char[]", b"TETHER_SLOTS=2")]
    array = ffi.new("char *[]", entries)
    for current, expected in ((1, []), (0, [h.slurm_conf, str(config)])):      # and slurm.conf's partitions
        job = ffi.new("tether_job_t *")
        job.spank_env, job.spank_env_size, job.config_current = array, 1, current
        job.min_nodes = job.max_nodes = job.num_tasks = 0xfffffffe
        job.ntasks_per_node = job.cpus_per_task = 0xfffe
        assert h.submit(job, 1000, 1) == ACCEPT, ffi.string(job.msg)
        assert stats == expected


# ---- the hardened build (issue 39): what the built objects show -----------------------------------

SPANK_ENTRY_POINTS = {"plugin_name", "plugin_type", "plugin_version", "spank_plugin_version"}
JOB_SUBMIT_ENTRY_POINTS = {"plugin_name", "plugin_type", "plugin_version", "init", "fini", "job_submit",
                           "job_modify"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Both plugins, tether-run and tether-jobdirs, built as `tether slurm build` and `tether pbs
    install` build them (in a temporary directory)."""
    from tether.admin.pbs import build_helper
    from tether.admin.slurm import build_plugins
    from tether.container.rank_launcher import build_rank_launcher

    out = tmp_path_factory.mktemp("hardened")
    build_plugins(out / "slurm", log=lambda *_: None)
    (out / "libexec").mkdir()
    settings = {"runtime": "podman", "environment": "inherit",
                "podman": {"args": [], "env": {}, "store": str(out / "store-{uid}")}}
    return {"spank": out / "slurm" / "spank_tether.so", "job_submit": out / "slurm" / "job_submit_tether.so",
            "tether-run": build_rank_launcher(out / "tether-run", None, settings, "/bin/false"),
            "tether-jobdirs": build_helper(out / "libexec", build_dir=out / "jobdirs-build")}


def _tool(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def dynamic_symbols(path: Path, *, defined: bool) -> set[str]:
    out = _tool("nm", "-D", "--defined-only" if defined else "--undefined-only", str(path))
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@pytest.mark.parametrize("name,expected", [("spank", SPANK_ENTRY_POINTS), ("job_submit", JOB_SUBMIT_ENTRY_POINTS)])
def test_a_plugin_exports_only_its_entry_points(built, name, expected):
    """A version script leaves Slurm's entry points the only dynamic symbols a plugin defines: no
    tether_* function (nor cffi's, nor the embedded module's) can be bound by another object."""
    exported = dynamic_symbols(built[name], defined=True)
    callbacks = {s for s in exported if s.startswith("slurm_spank_")} if name == "spank" else set()
    assert exported - callbacks == expected
    if name == "spank":
        assert {"slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_exit",
                "slurm_spank_job_epilog"} <= callbacks


@pytest.mark.parametrize("name", ["spank", "job_submit", "tether-run", "tether-jobdirs"])
def test_everything_tether_builds_is_hardened(built, name):
    """Full RELRO (GNU_RELRO, bound now), the stack protector and _FORTIFY_SOURCE=2 (checked
    variants of libc's calls imported), as pyxis builds its plugin."""
    path = built[name]
    dynamic = _tool("readelf", "-dW", str(path))
    assert re.search(r"\(FLAGS\)\s.*\bBIND_NOW\b", dynamic) or re.search(r"\(BIND_NOW\)", dynamic), dynamic
    assert re.search(r"\(FLAGS_1\)\s.*\bNOW\b", dynamic), dynamic
    assert "GNU_RELRO" in _tool("readelf", "-lW", str(path))
    imported = dynamic_symbols(path, defined=False)
    assert "__stack_chk_fail" in imported
    assert {s for s in imported if s.endswith("_chk") and s != "__stack_chk_fail"}, sorted(imported)


def test_werror_only_where_asked(monkeypatch):
    """-Werror where TETHER_WERROR=1 (the test run, CI), never in a site's install."""
    monkeypatch.setenv(toolchain.WERROR_ENV, "1")
    assert "-Werror" in toolchain.cflags()
    monkeypatch.delenv(toolchain.WERROR_ENV)
    assert "-Werror" not in toolchain.cflags()
    assert {"-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-O2"} <= set(toolchain.cflags())


def test_install_refuses_plugins_built_from_other_sources(tmp_path):
    """An upgrade without `tether slurm build`: install copied the earlier version's plugins and
    wrote this version's plugstack line, whose new argument (container_batch=1) that plugin refused
    -- every srun and sbatch of the cluster failed ("init() failed"). Now install stops first."""
    import json

    from tether.admin.slurm import install_plugins, sources_digest
    from tether.system.toolchain import BuildError

    stamp = {"toolchain": {"slurm_version": "22.05.8"}, "files": ["spank_tether.so"], "sources": "0" * 64}
    (tmp_path / "build.json").write_text(json.dumps(stamp))
    with pytest.raises(BuildError, match=r"built from other sources than this tether's .* `tether slurm build` "
                                         rf"again first \(--out {tmp_path}\)"):
        install_plugins(tmp_path, slurm_conf=tmp_path / "slurm.conf", log=lambda *_: None)
    del stamp["sources"]                                   # a build by a tether before the check
    (tmp_path / "build.json").write_text(json.dumps(stamp))
    with pytest.raises(BuildError, match="built from other sources"):
        install_plugins(tmp_path, slurm_conf=tmp_path / "slurm.conf", log=lambda *_: None)
    assert len(sources_digest()) == 64

"""Configuration: search order, defaults, validation with every error at once, the CLI."""

from __future__ import annotations

import pytest
import yaml

from tether.cli.main import main
from tether.hooks.config import BUILTIN, CONFIG_SCHEMA, default_config
from tether.hooks.configfile import DEFAULT_CONFIG_PATH, config_path, load_config
from tether.hooks.errors import ConfigError


def write(tmp_path, text, name="tether.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults():
    cfg = default_config()
    assert cfg.source == BUILTIN
    assert (cfg.slot_type, cfg.tres_supported, cfg.gres_supported) == ("cuda", True, True)
    assert cfg.default_aux_resource_pool is None and cfg.default_compute_resource_pool is None
    assert cfg.job_project_source is None
    assert cfg.job_storage_root == "/var/lib/tether/jobs"
    assert cfg.data["container"]["runtime"] == "apptainer"
    assert cfg.runtime("podman") == {"binary": "podman", "args": [], "env": {}, "cdi_kind": "nvidia.com/gpu",
                                     "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"], "store": "/var/lib/tether/users/{uid}/podman"}
    assert cfg.data["plugin"]["on_failure"] == "reject_tether_jobs"


def test_search_order(tmp_path):
    assert config_path("x.yaml", {"TETHER_CONFIG": "y.yaml"}) == ("x.yaml", True)
    assert config_path(None, {"TETHER_CONFIG": "y.yaml"}) == ("y.yaml", True)
    assert config_path(None, {}) == (DEFAULT_CONFIG_PATH, False)


def test_missing_default_file_means_builtin_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr("tether.hooks.configfile.DEFAULT_CONFIG_PATH", str(tmp_path / "absent.yaml"))
    assert load_config(None, {}).source == BUILTIN


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="absent.yaml: file not found"):
        load_config(str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="file not found"):
        load_config(None, {"TETHER_CONFIG": str(tmp_path / "absent.yaml")})


def test_empty_file_is_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "# nothing\n"))
    assert cfg.data == default_config().data


def test_full_file(tmp_path):
    path = write(tmp_path, """
slot_type: rocm
tres_supported: false
gres_supported: true
default_aux_resource_pool: aux
default_compute_resource_pool: gpu
job_project_source: label:team-
job_storage_root: /shared/tether/jobs
partition_overrides:
  gpu:
    slot_type: cuda
    gpu_type: a100
    sbatch_args: ["--constraint=ib"]
    pbsbatch_args: ["-l walltime=1:00:00"]
container:
  runtime: podman
  apptainer_image_root: /shared/images
  podman: {binary: /usr/bin/podman, args: ["--runtime", "runc"]}
plugin:
  on_failure: reject_all_jobs
""")
    cfg = load_config(path)
    assert cfg.slot_type == "rocm" and cfg.tres_supported is False
    assert cfg.partition_override("gpu").gpu_type == "a100"
    assert cfg.partition_override("cpu") is None
    assert cfg.runtime("podman")["args"] == ["--runtime", "runc"]
    assert cfg.runtime("enroot") == {"binary": "enroot", "args": [], "env": {}, "store": "/var/lib/tether/users/{uid}/enroot"}


def test_unknown_key_wrong_type_and_bad_enum_are_all_reported(tmp_path):
    path = write(tmp_path, "slot_typo: cuda\ntres_supported: 'yes'\nslot_type: gpu\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert lines == [
        f"{path}: slot_typo: unknown key; accepted keys here: " + ", ".join(CONFIG_SCHEMA.fields),
        f"{path}: slot_type: 'gpu' is not one of cuda, rocm, cpu",
        f"{path}: tres_supported: expected true or false, got string 'yes'",
    ]


@pytest.mark.parametrize("text,fragment", [
    ("partition_overrides:\n  gpu:\n    slot_type: tpu\n",
     "partition_overrides.gpu.slot_type: 'tpu' is not one of cuda, rocm, cpu (or null)"),
    ("partition_overrides:\n  'bad name':\n    slot_type: cpu\n",
     "partition_overrides.bad name: 'bad name' is not a valid partition"),
    ("partition_overrides:\n  gpu:\n    sbatch_args: [\"--nodes=2\", \"--bogus\"]\n",
     "partition_overrides.gpu.sbatch_args: --bogus: --bogus is not an sbatch option"),
    ("partition_overrides:\n  gpu:\n    pbsbatch_args: [\"-Y\"]\n",
     "partition_overrides.gpu.pbsbatch_args: -Y: -Y is not a qsub option"),
    ("partition_overrides:\n  gpu:\n    sbatch_args: --mem=1G\n",
     "partition_overrides.gpu.sbatch_args: expected a list, each a string, got string"),
    ("job_storage_root: relative/path\n", "job_storage_root: 'relative/path' is not an absolute path"),
    ("job_storage_root: /a/../etc\n", "job_storage_root: '/a/../etc' is not an absolute path"),
    ("job_storage_root: '/a b'\n", "job_storage_root: '/a b' is not an absolute path"),
    ("job_project_source: projects\n", "job_project_source: 'projects' is not one of project, workspace"),
    ("default_aux_resource_pool: 'a;b'\n", "default_aux_resource_pool: 'a;b' is not a partition/queue name"),
    ("container:\n  runtime: docker\n", "container.runtime: 'docker' is not one of apptainer, singularity"),
    ("container:\n  podman:\n    binary: ''\n", "container.podman.binary: '' is not a command name or path"),
    ("container:\n  podman:\n    env: {BAD-NAME: x}\n",
     "container.podman.env.BAD-NAME: 'BAD-NAME' is not a valid variable name (letters, digits and '_', not "
     "starting with a digit)"),
    ("container:\n  podman:\n    argz: []\n", "container.podman.argz: unknown key; accepted keys here: binary, args, env, cdi_kind, cdi_spec_dirs"),
    ("plugin:\n  on_failure: accept\n", "plugin.on_failure: 'accept' is not one of reject_tether_jobs, reject_all_jobs"),
    ("container: 3\n", "container: expected a mapping with keys runtime"),
    ("- a\n- b\n", ": expected a mapping with keys slot_type"),
    ("slot_type: null\n", "slot_type: must not be null"),
])
def test_validation_messages(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert fragment in str(err.value)
    assert all(line.startswith(f"{path}: ") for line in str(err.value).splitlines())


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "slot_type: cuda\ntres_supported: [true\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: line 3, column 1: invalid YAML")


def test_duplicate_keys_are_refused(tmp_path):
    path = write(tmp_path, "slot_type: cuda\nslot_type: cpu\n")
    with pytest.raises(ConfigError, match="line 2, column 1: invalid YAML: duplicate key 'slot_type'"):
        load_config(path)


def test_binary_garbage_is_a_clear_error(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(path))


# ---- CLI ---------------------------------------------------------------------------------------
def test_config_check_ok(tmp_path, capsys):
    path = write(tmp_path, "slot_type: cpu\n")
    assert main(["config", "check", path]) == 0
    assert capsys.readouterr().out == f"ok ({path})\n"


def test_config_check_reports_all_errors_and_exits_1(tmp_path, capsys):
    path = write(tmp_path, "bogus: 1\ntres_supported: 3\nslot_type: tpu\n")
    assert main(["config", "check", path]) == 1
    out = capsys.readouterr().out
    assert "bogus: unknown key" in out
    assert "tres_supported: expected true or false, got integer 3" in out
    assert "slot_type: 'tpu' is not one of cuda, rocm, cpu" in out


def test_config_check_uses_config_option_and_env(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, "slot_type: tpu\n")
    assert main(["config", "check", "--config", path]) == 1
    monkeypatch.setenv("TETHER_CONFIG", path)
    assert main(["config", "check"]) == 1
    assert main(["--config", write(tmp_path, "{}\n", "ok.yaml"), "config", "check"]) == 0


def test_config_show_prints_effective_config(tmp_path, capsys):
    path = write(tmp_path, "slot_type: cpu\npartition_overrides:\n  gpu: {gpu_type: a100}\n")
    assert main(["config", "show", "--config", path]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert shown["slot_type"] == "cpu"
    assert shown["partition_overrides"]["gpu"] == {"slot_type": None, "gpu_type": "a100",
                                                   "sbatch_args": [], "pbsbatch_args": []}
    assert shown["container"]["enroot"] == {"binary": "enroot", "args": [], "env": {}, "store": "/var/lib/tether/users/{uid}/enroot"}
    assert out.startswith(f"# effective tether configuration from {path}")


def test_config_show_with_broken_config_exits_1(tmp_path, capsys):
    assert main(["config", "show", "--config", write(tmp_path, "slot_type: tpu\n")]) == 1
    assert "slot_type: 'tpu' is not one of" in capsys.readouterr().err

"""Reading tether's configuration file (YAML) and job specs: strict YAML, validated at load.

Where the config is read from: ``--config FILE``, else ``$TETHER_CONFIG``, else
``/etc/tether/tether.yaml``; a missing default file means built-in defaults, and a file named by
``--config`` or ``$TETHER_CONFIG`` must exist. Used by the CLI, the job_submit handler and the
container launcher; the PBS hooks get the validated config as JSON instead (see tether.hooks.config).
"""

from __future__ import annotations

import os

import yaml

from .config import Config, default_config, plain_data, validate_config
from .errors import ConfigError

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Any, Mapping

DEFAULT_CONFIG_PATH = "/etc/tether/tether.yaml"
CONFIG_ENV = "TETHER_CONFIG"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "unhashable key", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML strictly; a syntax error becomes a ConfigError naming file, line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}invalid YAML: {problem}"]) from None


def config_path(explicit: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """Which file to read, and whether it must exist (explicit file or $TETHER_CONFIG)."""
    env = os.environ if env is None else env
    if explicit:
        return explicit, True
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV], True
    return DEFAULT_CONFIG_PATH, False


def load_config(explicit: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load and validate the configuration (see the module docstring for the search order)."""
    path, required = config_path(explicit, env)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        if required:
            raise ConfigError(path, ["file not found"]) from None
        return default_config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"cannot read: {exc}"]) from None
    return validate_config(load_yaml(text, path), path)


def dump_yaml(config: Config) -> str:
    """The effective configuration as YAML (``tether config show``)."""
    return yaml.safe_dump(plain_data(config.data), sort_keys=False, default_flow_style=False)

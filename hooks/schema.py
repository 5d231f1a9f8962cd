"""A tiny declarative schema for YAML documents (the config file and job specs).

Runtime dependencies stay at cffi, pyyaml and jinja2, so this is the validator: each node checks
a value, appends every problem it finds to a shared list (so a user sees all errors at once) and
returns the normalized value with defaults filled in. Every node carries a one-line ``doc`` and an
``accepted`` description, which the README reference and error messages are built from.
"""

from __future__ import annotations

import re

from .records import dataclass, field

TYPE_CHECKING = False  # not `typing`: slurmctld's interpreter imports this module (the job_submit handler)

if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = [
    "Node", "Str", "Bool", "Int", "Enum", "List", "Map", "Struct", "SchemaError",
    "NAME_PATTERN", "walk_keys",
]

# Names that end up in scheduler options (partitions, queues, GPU types): safe as a bare shell word.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"

_MISSING = object()


@dataclass
class SchemaError:
    """One problem in a document: where (key path) and what (message naming what is accepted)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


@dataclass
class Node:
    """Base schema node. ``nullable`` admits YAML null; ``default`` is used when a key is absent."""

    doc: str = ""
    default: Any = None
    nullable: bool = False

    accepted: str = "a value"

    def check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if value is None:
            if self.nullable:
                return None
            errors.append(SchemaError(path, f"must not be null; expected {self.describe()}"))
            return None
        return self._check(value, path, errors)

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:
        text = self.accepted
        return f"{text} or null" if self.nullable else text

    def fill_default(self) -> Any:
        return self.default


@dataclass
class Str(Node):
    pattern: str | None = None
    accepted: str = "a string"

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, str):
            errors.append(SchemaError(path, f"expected {self.describe()}, got {_type_name(value)} {value!r}"))
            return None
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            errors.append(SchemaError(path, f"{value!r} is not {self.describe()}"))
            return None
        return value


@dataclass
class Bool(Node):
    accepted: str = "true or false"

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, bool):
            errors.append(SchemaError(path, f"expected {self.describe()}, got {_type_name(value)} {value!r}"))
            return None
        return value


@dataclass
class Int(Node):
    minimum: int | None = None
    maximum: int | None = None
    accepted: str = ""

    def describe(self) -> str:
        if self.accepted:
            return super().describe()
        lo = "" if self.minimum is None else f" >= {self.minimum}"
        hi = "" if self.maximum is None else f" <= {self.maximum}"
        text = "an integer" + lo + ("," if lo and hi else "") + hi
        return f"{text} or null" if self.nullable else text

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(SchemaError(path, f"expected {self.describe()}, got {_type_name(value)} {value!r}"))
            return None
        if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum):
            errors.append(SchemaError(path, f"{value} is out of range; expected {self.describe()}"))
            return None
        return value


@dataclass
class Enum(Node):
    choices: Sequence[str] = ()
    accepted: str = ""

    def describe(self) -> str:
        text = "one of " + ", ".join(self.choices)
        return f"{text} (or null)" if self.nullable else text

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            errors.append(SchemaError(path, f"{value!r} is not {self.describe()}"))
            return None
        return value


@dataclass
class List(Node):
    item: Node = field(default_factory=Str)
    accepted: str = ""

    def describe(self) -> str:
        text = f"a list, each {self.item.describe()}"
        return f"{text} or null" if self.nullable else text

    def fill_default(self) -> Any:
        return list(self.default) if self.default is not None else None

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, list):
            errors.append(SchemaError(path, f"expected {self.describe()}, got {_type_name(value)}"))
            return None
        return [self.item.check(v, _join(path, i), errors) for i, v in enumerate(value)]


@dataclass
class Struct(Node):
    """A mapping with a fixed set of keys; unknown keys are errors that list the known ones."""

    fields: Mapping[str, Node] = field(default_factory=dict)
    extra_check: Callable[[dict, str, list[SchemaError]], None] | None = None
    accepted: str = "a mapping"

    def fill_default(self) -> Any:
        return {k: f.fill_default() for k, f in self.fields.items()}

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, dict):
            errors.append(SchemaError(path, f"expected a mapping with keys {', '.join(self.fields)}, "
                                            f"got {_type_name(value)}"))
            return self.fill_default()
        out: dict[str, Any] = {}
        for key in value:
            if key not in self.fields:
                errors.append(SchemaError(_join(path, key),
                                          f"unknown key; accepted keys here: {', '.join(self.fields)}"))
        for key, node in self.fields.items():
            raw = value.get(key, _MISSING)
            out[key] = node.fill_default() if raw is _MISSING else node.check(raw, _join(path, key), errors)
        if self.extra_check is not None:
            self.extra_check(out, path, errors)
        return out


@dataclass
class Map(Node):
    """A mapping from user-chosen names (matching ``key_pattern``) to values of one schema."""

    value: Node = field(default_factory=Str)
    key_pattern: str = NAME_PATTERN
    key_doc: str = "name"
    key_accepted: str = "letters, digits, '.', '_', '-'"
    accepted: str = "a mapping"

    def fill_default(self) -> Any:
        return dict(self.default) if self.default is not None else {}

    def _check(self, value: Any, path: str, errors: list[SchemaError]) -> Any:
        if not isinstance(value, dict):
            errors.append(SchemaError(path, f"expected a mapping of {self.key_doc} to settings, "
                                            f"got {_type_name(value)}"))
            return {}
        out = {}
        for key, raw in value.items():
            if not isinstance(key, str) or not re.fullmatch(self.key_pattern, key):
                errors.append(SchemaError(_join(path, key), f"{key!r} is not a valid {self.key_doc} "
                                                             f"({self.key_accepted})"))
                continue
            out[key] = self.value.check(raw, _join(path, key), errors)
        return out


def walk_keys(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    """Yield (key path, node) for every documented key, depth first (used for the README reference)."""
    if isinstance(node, Struct):
        for key, child in node.fields.items():
            sub = _join(path, key)
            yield sub, child
            yield from walk_keys(child, sub)
    elif isinstance(node, Map):
        sub = _join(path, f"<{node.key_doc}>")
        yield from walk_keys(node.value, sub)

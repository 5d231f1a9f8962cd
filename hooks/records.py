"""Value classes without the standard library's `dataclasses`, which imports `inspect` (and with it
`ast`, `dis`, `tokenize`, `linecache`, ...): about 20 modules and 2 MiB that slurmctld's embedded
interpreter would load for the job_submit handler, which plans with tether.hooks, and several
milliseconds of every container rank's start (the Python launcher's LaunchSpec, Mount, Launch).

``@dataclass``, ``@dataclass(frozen=True)``, ``field(default_factory=...)`` and ``asdict`` behave as
the standard library's do for what tether's classes use: fields from the class's annotations (a
base class's first), defaults, ``__init__``, ``__repr__`` and ``__eq__`` by the fields, ``__match_args__``;
a frozen class refuses assignment (FrozenInstanceError) and hashes by its fields, an unfrozen one
is unhashable. Methods a class defines itself are kept. Not supported (and not used): ``ClassVar``
and ``InitVar`` annotations, ``field()``'s other options, ``__post_init__``, ``order``, ``slots``.
"""

from __future__ import annotations

_FIELDS = "__record_fields__"       # on each class: field name -> default (_MISSING: none)
_MISSING = object()


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen value."""


class _Factory:
    """A field's ``default_factory``."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def field(*, default_factory):
    """A field whose default is made anew for each value (``default_factory()``)."""
    return _Factory(default_factory)


def dataclass(cls=None, /, *, frozen: bool = False):
    """The class made a value class (see the module docstring)."""
    def wrap(cls):
        return _make(cls, frozen)
    return wrap if cls is None else wrap(cls)


def asdict(obj) -> dict:
    """A value as a dict of its fields, values inside it (and inside lists, tuples, dicts) too."""
    if not hasattr(type(obj), _FIELDS):
        raise TypeError("asdict() should be called on dataclass instances")
    return _plain(obj)


def _plain(obj):
    if hasattr(type(obj), _FIELDS):
        return {name: _plain(getattr(obj, name)) for name in getattr(type(obj), _FIELDS)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):          # a namedtuple
        return type(obj)(*[_plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((_plain(k), _plain(v)) for k, v in obj.items())
    import copy

    return copy.deepcopy(obj)


def _make(cls, frozen: bool):
    # as dataclasses decides it, before any method is added: a __hash__ of the class's own
    explicit_hash = "__hash__" in cls.__dict__ and not (cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__)
    found: dict[str, object] = {}
    for base in reversed(cls.__mro__[1:]):
        found.update(base.__dict__.get(_FIELDS, {}))
    for name in cls.__dict__.get("__annotations__", {}):
        default = cls.__dict__.get(name, _MISSING)
        if isinstance(default, _Factory):
            delattr(cls, name)
        found[name] = default
    setattr(cls, _FIELDS, found)

    names = list(found)
    scope: dict[str, object] = {"_Factory": _Factory, "_FIELDS": found}
    params, body, seen_default = [], [], None
    for name, default in found.items():
        if default is _MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {name!r} follows default argument")
            params.append(name)
        else:
            seen_default = name
            params.append(f"{name}=_FIELDS[{name!r}]")
        value = f"{name}.make() if type({name}) is _Factory else {name}" if isinstance(default, _Factory) else name
        body.append(f"_d[{name!r}] = {value}" if frozen else f"self.{name} = {value}")
    # a frozen value's fields go straight into its __dict__ (the class's __setattr__ refuses them)
    source = (f"def __init__(self, {', '.join(params)}):\n" + ("    _d = self.__dict__\n" if frozen else "")
              + "".join(f"    {line}\n" for line in body or ["pass"]))
    exec(source, scope)     # noqa: S102 - our own generated code, as dataclasses does
    _add(cls, "__init__", scope["__init__"])

    def __repr__(self):
        return f"{type(self).__qualname__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)
        return NotImplemented

    _add(cls, "__repr__", __repr__)
    _add(cls, "__eq__", __eq__)
    _add(cls, "__match_args__", tuple(names))
    if frozen:
        def __setattr__(self, name, value):
            if type(self) is cls or name in found:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")
            super(cls, self).__setattr__(name, value)

        def __delattr__(self, name):
            if type(self) is cls or name in found:
                raise FrozenInstanceError(f"cannot delete field {name!r}")
            super(cls, self).__delattr__(name)

        for name, method in (("__setattr__", __setattr__), ("__delattr__", __delattr__)):
            if name in cls.__dict__:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, method)
        if not explicit_hash:
            cls.__hash__ = lambda self: hash(tuple(getattr(self, n) for n in names))
    elif not explicit_hash:
        cls.__hash__ = None
    return cls


def _add(cls, name: str, value) -> None:
    """Set a generated method unless the class defines its own."""
    if name not in cls.__dict__:
        if callable(value):
            value.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, value)

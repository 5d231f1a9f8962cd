"""tether.hooks.records against the standard library's dataclasses: the same classes made both ways
behave alike (construction, defaults, factories, inheritance, repr, equality, hashing, frozen
assignment, asdict); and slurmctld's interpreter loads no `dataclasses` for the job_submit handler."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import namedtuple

import pytest

from tether.hooks import records

Pair = namedtuple("Pair", "a b")


def define(module):
    """The same classes, made with ``module``'s dataclass and field."""

    @module.dataclass(frozen=True)
    class Point:
        x: int
        y: int = 0
        tags: tuple[str, ...] = ()

    @module.dataclass(frozen=True)
    class Shape:
        name: str
        points: tuple = ()
        extra: dict = module.field(default_factory=dict)

        def __str__(self) -> str:
            return f"shape {self.name}"

    @module.dataclass
    class Base:
        doc: str = ""
        accepted: str = "a value"

        def describe(self) -> str:
            return self.accepted

    @module.dataclass
    class Child(Base):
        pattern: str | None = None
        accepted: str = "a string"
        items: list = module.field(default_factory=list)

    return Point, Shape, Base, Child


STD, OURS = define(dataclasses), define(records)


def outcome(make):
    """What calling ``make()`` gives: its value's repr, or the exception's type."""
    try:
        return repr(make())
    except Exception as exc:    # noqa: BLE001 - the type is the outcome
        return type(exc).__name__


@pytest.mark.parametrize("args,kwargs", [((1,), {}), ((1, 2), {}), ((1, 2, ("a",)), {}), ((), {"x": 3, "tags": ("b",)}),
                                         ((), {}), ((1,), {"x": 2}), ((1, 2, (), 4), {}), ((), {"z": 1})])
def test_construction_and_repr(args, kwargs):
    assert outcome(lambda: OURS[0](*args, **kwargs)) == outcome(lambda: STD[0](*args, **kwargs))


def test_defaults_factories_and_inheritance():
    for (Point, Shape, Base, Child) in (STD, OURS):
        a, b = Shape("a"), Shape("a")
        assert a.extra == {} and a.extra is not b.extra and str(a) == "shape a"
        c = Child("d", "x", "p")
        assert (c.doc, c.accepted, c.pattern, c.items, c.describe()) == ("d", "x", "p", [], "x")
        assert Child().accepted == "a string" and Child.accepted == "a string" and Base.accepted == "a value"
    assert [repr(cls()) for cls in OURS[2:]] + [repr(OURS[3]("d", items=[1]))] == \
        [repr(cls()) for cls in STD[2:]] + [repr(STD[3]("d", items=[1]))]
    assert OURS[3].__match_args__ == STD[3].__match_args__ == ("doc", "accepted", "pattern", "items")


def test_equality_hashing_and_frozen():
    for (Point, Shape, Base, Child) in (STD, OURS):
        assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1) and Point(1) != (1, 0, ())
        assert hash(Point(1, 2, ("a",))) == hash(Point(1, 2, ("a",))) == hash((1, 2, ("a",)))
        assert len({Point(1), Point(1), Point(2)}) == 2
        with pytest.raises(AttributeError, match="cannot assign to field 'x'"):
            Point(1).x = 2
        with pytest.raises(AttributeError):
            del Point(1).y
        with pytest.raises(TypeError):
            hash(Shape("a"))                     # a dict inside
        with pytest.raises(TypeError):
            hash(Base())                         # unfrozen: unhashable
        base = Base()
        base.doc = "changed"
        assert base == Base("changed") and base != Child("changed")
    assert issubclass(records.FrozenInstanceError, AttributeError)


def test_asdict():
    for module, (Point, Shape, Base, Child) in ((dataclasses, STD), (records, OURS)):
        shape = Shape("s", (Point(1, 2), [Point(3)], Pair(Point(4), "b")), {"k": [Point(5)]})
        got = module.asdict(shape)
        assert got == {"name": "s", "points": ({"x": 1, "y": 2, "tags": ()}, [{"x": 3, "y": 0, "tags": ()}],
                                               Pair({"x": 4, "y": 0, "tags": ()}, "b")),
                       "extra": {"k": [{"x": 5, "y": 0, "tags": ()}]}}
        assert type(got["points"][2]) is Pair
    with pytest.raises(TypeError):
        records.asdict((1, 2))


def test_a_field_without_default_after_one_with_is_refused():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @records.dataclass
        class Bad:
            a: int = 0
            b: int


def test_the_handler_loads_no_dataclasses():
    """The modules the job_submit handler imports in slurmctld leave dataclasses (and inspect,
    typing, traceback) out."""
    code = ("import sys; import tether.job_submit.handler; "
            "print(sorted(m for m in ('dataclasses', 'inspect', 'typing', 'traceback') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

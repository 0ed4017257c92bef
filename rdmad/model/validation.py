"""Plain data (parsed TOML) -> the config's Structs, with every error and its key path.

msgspec checks each value against its type and ``msgspec.Meta`` constraints and builds
the frozen Structs; what it does not do is written here, in one walk over the data:

* **every error, not the first**: msgspec stops at the first bad value; an operator
  fixing a config wants them all at once (rdmad.config reports each with its file);
* **checks that normalize** (a MAC lowercased, "150ms" read as seconds): ``Before`` and
  ``After`` in a field's ``Annotated`` metadata, run before and after msgspec's check
  (msgspec ignores metadata it does not know);
* strings stripped of surrounding whitespace, as a hand-edited file expects;
* messages in the config's words (key, table, array), not Python's.

A Struct's ``__post_init__`` checks rules across its fields; it runs only when every
field was valid, and its ValueError is reported at the Struct's own path.

Why not pydantic, which does all of this: its import and schema building were a third
of the daemon's start-up before its first pass (~0.75 s under TCG, bench/RESULTS.md).
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]
T = TypeVar("T")


class Before:
    """Run ``fn`` on the raw value before msgspec's check (it may convert, e.g. "5m" -> 300.0).

    ``fn`` raises ValueError with the message to report.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


class After:
    """Run ``fn`` on the value msgspec checked (it may normalize, e.g. lowercase a MAC)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


class SpecError(ValueError):
    """Data that does not fit a Struct: every problem, each with its key path."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{render(loc) or '(top)'}: {msg}" for loc, msg in problems))


class _Invalid:
    """The result of a value that did not validate (its problems are already recorded)."""


_INVALID = _Invalid()


def validate(spec: type[T], data: Any) -> T:
    """``data`` as a ``spec`` Struct; SpecError with every problem when it does not fit."""
    problems: list[Problem] = []
    value = _value(data, spec, (), problems)
    if problems or isinstance(value, _Invalid):
        raise SpecError(problems)
    return value  # type: ignore[no-any-return]


def render(loc: Loc) -> str:
    """('sriov', 0, 'vf', 1, 'mac') -> 'sriov[0].vf[1].mac'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _value(data: Any, tp: Any, loc: Loc, problems: list[Problem]) -> Any:
    if isinstance(data, str):
        data = data.strip()
    befores: list[Before] = []
    afters: list[After] = []
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        befores = [m for m in meta if isinstance(m, Before)]
        afters = [m for m in meta if isinstance(m, After)]
        kept = [m for m in meta if isinstance(m, msgspec.Meta)]
        args = (base, *kept)  # one name: Annotated[(a, *b)] is 3.11 syntax to mypy
        tp = Annotated[args] if kept else base
    data = _checked(befores, data, loc, problems)
    if isinstance(data, _Invalid):
        return data
    value = _typed(data, tp, loc, problems)
    if isinstance(value, _Invalid):
        return value
    return _checked(afters, value, loc, problems)


def _checked(
    checks: list[Before] | list[After], value: Any, loc: Loc, problems: list[Problem]
) -> Any:
    """``value`` through each check in turn; the first ValueError is the problem."""
    for check in checks:
        try:
            value = check.fn(value)
        except ValueError as exc:
            problems.append((loc, str(exc)))
            return _INVALID
    return value


def _typed(data: Any, tp: Any, loc: Loc, problems: list[Problem]) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        arms = [a for a in get_args(tp) if a is not type(None)]
        if data is None and len(arms) < len(get_args(tp)):
            return None
        if len(arms) == 1:
            return _value(data, arms[0], loc, problems)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _struct(data, tp, loc, problems)
    if origin is tuple and len(get_args(tp)) == 2 and get_args(tp)[1] is Ellipsis:
        if not isinstance(data, list | tuple):
            problems.append((loc, f"expected an array, got {_kind(data)}"))
            return _INVALID
        items = [_value(item, get_args(tp)[0], (*loc, i), problems) for i, item in enumerate(data)]
        return _INVALID if any(isinstance(i, _Invalid) for i in items) else tuple(items)
    if origin is Literal:
        if data in get_args(tp) and type(data) in {type(a) for a in get_args(tp)}:
            return data
        choices = ", ".join(repr(a) for a in get_args(tp))
        problems.append((loc, f"must be one of {choices}, not {data!r}"))
        return _INVALID
    try:
        return msgspec.convert(data, tp, strict=True)
    except msgspec.ValidationError as exc:
        problems.append((loc, _words(str(exc), data)))
        return _INVALID


def _struct(data: Any, spec: type[msgspec.Struct], loc: Loc, problems: list[Problem]) -> Any:
    if isinstance(data, spec):
        return data
    if not isinstance(data, dict):
        problems.append((loc, f"expected a table, got {_kind(data)}"))
        return _INVALID
    fields = _fields(spec)
    given: dict[str, Any] = {}
    ok = True
    for key, raw in data.items():
        field = fields.get(key)
        if field is None:
            import difflib  # here: only an unknown key needs it, a good config never does

            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(((*loc, key), f"unknown key{hint}"))
            ok = False
            continue
        value = _value(raw, field.type, (*loc, key), problems)
        if isinstance(value, _Invalid):
            ok = False
        else:
            given[key] = value
    for name, field in fields.items():
        if field.required and name not in data:
            problems.append(((*loc, name), "required key is missing"))
            ok = False
    if not ok:
        return _INVALID
    try:
        return spec(**given)  # __post_init__: rules across fields
    except (ValueError, TypeError) as exc:
        problems.append((loc, str(exc)))
        return _INVALID


@functools.cache
def _fields(spec: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A Struct's fields by name, once per Struct: msgspec resolves the type hints on
    every call (~0.24 ms on a host, which was most of validating 256 VFs)."""
    return {f.name: f for f in msgspec.structs.fields(spec)}


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "an array",
    "object": "a table",
    "null": "nothing",
}


def _kind(data: Any) -> str:
    """What ``data`` is, in the same words (bool first: it is also an int)."""
    for tp, name in (
        (bool, "bool"),
        (int, "int"),
        (float, "float"),
        (str, "str"),
        (dict, "object"),
        (list, "array"),
    ):
        if isinstance(data, tp):
            return _TYPE_WORDS[name]
    return type(data).__name__


def _words(message: str, data: Any) -> str:
    """msgspec's message in the config's words: "Expected `int` <= 7" -> "must be an
    integer <= 7, not 9"."""
    message = message.split(" - at `", 1)[0]
    if m := re.fullmatch(r"Expected `(\w+)` matching regex '(.*)'", message):
        return f"must match {m.group(2)}, not {data!r}"
    if m := re.fullmatch(r"Expected `(\w+)` (.*)", message):
        what = _TYPE_WORDS.get(m.group(1), m.group(1))
        return f"must be {what} {m.group(2)}, not {data!r}"
    if m := re.fullmatch(r"Expected `(\w+)`, got `(\w+)`", message):
        what = _TYPE_WORDS.get(m.group(1), m.group(1))
        return f"expected {what}, got {_kind(data)}"
    return message

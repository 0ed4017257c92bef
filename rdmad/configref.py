"""The config reference, docs/CONFIG-REFERENCE.md, generated from the config schema.

    .venv/bin/python -m rdmad.configref            # write docs/CONFIG-REFERENCE.md
    .venv/bin/python -m rdmad.configref --check    # exit 1 when the page is not current
    .venv/bin/python -m rdmad.configref --out -    # print it

It walks ``Desired`` (the msgspec Structs the config is validated against, so the
keys, types and defaults are the schema's own) and takes each key's meaning from
``rdmad.model.descriptions``, the one place they are written, beside the schema. A
key of the schema without a description, a description of a key the schema does not
have, or a type this module cannot name is an error: the page never falls behind the
schema in silence.

A tool for the docs: nothing in the daemon imports it.
"""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from rdmad.configguide import EXAMPLES, NOT_DONE
from rdmad.model import Desired
from rdmad.model.descriptions import DESCRIPTIONS
from rdmad.model.desired import Patterns, PciIds, VfIndex, VfMac
from rdmad.model.validation import After, Before
from rdmad.model.values import (
    AnyMac,
    Guid,
    IfName,
    PciAddress,
    RdmaName,
    UnicastMac,
    parse_duration,
)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "CONFIG-REFERENCE.md"
COMMAND = "python -m rdmad.configref"

# Value types of the schema that have a name, and how the page calls them.
NAMED_TYPES: tuple[tuple[Any, str], ...] = (
    (UnicastMac, "MAC address, unicast, not all zeros (`xx:xx:xx:xx:xx:xx`)"),
    (AnyMac, "MAC address (`xx:xx:xx:xx:xx:xx`)"),
    (Guid, "GUID, 8 bytes (`xx:xx:xx:xx:xx:xx:xx:xx`)"),
    (PciAddress, "PCI address (`DDDD:BB:DD.F`; `BB:DD.F` is domain 0000)"),
    (IfName, "interface name (1-15 characters; no `/`, `:` or space)"),
    (RdmaName, "RDMA link name (1-63 of `A-Z a-z 0-9 _ . -`)"),
    (PciIds, 'PCI ID (4 hex digits, `"15b3"`), or an array of them'),
    (Patterns, "shell pattern (`*`, `?`, `[...]`), or an array of them"),
    (VfIndex, 'integer 0-4095, a range (`"0-7"`) or `"rest"`'),
    (VfMac, 'MAC address, unicast, or `{ derive = "pf-mac" }` / `{ derive = "machine-id" }`'),
)


class SchemaError(Exception):
    """The schema has something the page cannot say (a key without a description, ...)."""


@dataclass(frozen=True)
class Key:
    key: str  # within its table: "mac", "netdev.pci"
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Table:
    path: str  # "daemon", "sriov.vf"
    array: bool  # [[path]] rather than [path]
    meaning: str
    keys: tuple[Key, ...]


# --- the walk ----------------------------------------------------------------------


def _struct(tp: Any) -> type[msgspec.Struct] | None:
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def _array_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct of ``tuple[Struct, ...]`` (an array of tables), else None."""
    if get_origin(tp) is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return _struct(args[0])
    return None


def tables(root: type[msgspec.Struct] = Desired) -> list[Table]:
    """Every table of the config, in the schema's order; arrays nested in an array of
    tables (``[[sriov.vf]]``) follow their parent."""
    out: list[Table] = []
    used: set[str] = set()
    for f in msgspec.structs.fields(root):
        if (sub := _struct(f.type)) is not None:
            _table(f.name, sub, False, out, used)
        elif (sub := _array_of(f.type)) is not None:
            _table(f.name, sub, True, out, used)
        else:
            raise SchemaError(f"{f.name}: a top-level key that is not a table")
    unused = set(DESCRIPTIONS) - used
    if unused:
        raise SchemaError(
            "descriptions of keys the schema does not have (remove them from "
            f"rdmad/model/descriptions.py): {', '.join(sorted(unused))}"
        )
    return out


def _describe(path: str, used: set[str]) -> str:
    used.add(path)
    try:
        return DESCRIPTIONS[path]
    except KeyError:
        raise SchemaError(
            f"{path}: no description; add one to rdmad/model/descriptions.py"
        ) from None


def _table(
    path: str,
    spec: type[msgspec.Struct],
    array: bool,
    out: list[Table],
    used: set[str],
) -> None:
    meaning = _describe(f"[[{path}]]" if array else f"[{path}]", used)
    keys: list[Key] = []
    nested: list[tuple[str, type[msgspec.Struct]]] = []
    _keys(path, "", spec, keys, nested, used)
    out.append(Table(path, array, meaning, tuple(keys)))
    for sub_path, sub in nested:
        _table(sub_path, sub, True, out, used)


def _keys(
    table: str,
    prefix: str,
    spec: type[msgspec.Struct],
    keys: list[Key],
    nested: list[tuple[str, type[msgspec.Struct]]],
    used: set[str],
) -> None:
    for f in msgspec.structs.fields(spec):
        key = f"{prefix}{f.name}"
        path = f"{table}.{key}"
        meaning = _describe(path, used)
        if (sub := _array_of(f.type)) is not None:
            keys.append(Key(key, f"array of tables: `[[{path}]]`", "none", meaning))
            nested.append((path, sub))
        elif (sub := _struct(_optional(f.type)[0])) is not None:
            names = ", ".join(f"`{s.name}`" for s in msgspec.structs.fields(sub))
            keys.append(Key(key, f"inline table of {names}", _default(f), meaning))
            _keys(table, f"{key}.", sub, keys, nested, used)
        else:
            keys.append(Key(key, type_name(f.type), _default(f), meaning))


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without ``| None``, whether it had it)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
        raise SchemaError(f"a union this page cannot name: {tp!r}")
    return tp, False


# --- types and defaults ------------------------------------------------------------


def type_name(tp: Any) -> str:
    """How the page calls a key's type: the base type, its constraints and checks."""
    tp, _ = _optional(tp)
    for named, name in NAMED_TYPES:
        if tp == named:
            return name
    base: Any = tp
    meta: tuple[Any, ...] = ()
    if get_origin(tp) is Annotated:
        base, *rest = get_args(tp)
        meta = tuple(rest)
    if get_origin(base) is Literal:
        return "one of " + ", ".join(f"`{_toml(v)}`" for v in get_args(base))
    duration = any(isinstance(m, Before) and m.fn is parse_duration for m in meta)
    words = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if base not in words:
        raise SchemaError(f"a type this page cannot name: {tp!r}")
    name = "duration" if duration else words[base]
    unit = " s" if duration else ""
    limits: list[str] = []
    for m in meta:
        if isinstance(m, msgspec.Meta):
            for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                value = getattr(m, attr)
                if value is not None:
                    limits.append(f"{sign} {_number(value)}{unit}")
            if m.pattern is not None:
                limits.append(f"matching `{m.pattern}`")
        elif isinstance(m, Before | After) and not duration:
            # A check of a field's own (e.g. the metrics listener's loopback rule): the
            # meaning says what it allows.
            limits.append("checked further (see the meaning)")
    return ", ".join([name, *limits])


def _number(value: float) -> str:
    return f"{value:g}"


def _duration(seconds: float) -> str:
    """Seconds as the config writes them: "5m", "30s", "150ms"."""
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f'"{seconds / size:g}{unit}"'
    return f'"{seconds * 1000:g}ms"'


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return f"{value!r}"


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.required:
        return "required"
    if f.default_factory is not msgspec.NODEFAULT:
        return "(table)"
    value = f.default
    if value is None:
        return "unset"
    if value == ():
        return "none"
    if get_origin(f.type) is Annotated and any(
        isinstance(m, Before) and m.fn is parse_duration for m in get_args(f.type)[1:]
    ):
        return f"`{_duration(value)}`"
    return f"`{_toml(value)}`"


# --- the page ------------------------------------------------------------------------

HEADER = f"""# Config reference

<!-- Generated by `{COMMAND}` from the config schema (rdmad.model.desired) and
the descriptions in rdmad/model/descriptions.py, the examples in rdmad/configguide.py.
Do not edit by hand: change those, then run it again. -->

Every table and key of `/etc/rdmad/rdmad.toml` and `/etc/rdmad/rdmad.d/*.toml`, with
its type, default and meaning, generated from the schema the config is validated
against. How the files are found and merged: [CONFIG.md](CONFIG.md); every key with
comments: `/usr/share/doc/rdmad/examples/rdmad.toml` on a node (`etc/rdmad/rdmad.toml`
in the source); whole setups: [Examples](#examples). Any other key is an error.

A **duration** is a number of seconds or a string with units, as systemd writes them:
`"150ms"`, `"30s"`, `"5m"` or `"5min"`, `"1h 30s"`, `"1d"`. **required**: every entry
of the table must give the key; **unset**: no default, the key left out has no value
(its meaning says what that does; a VF attribute left out is never touched). Strings
are stripped of surrounding spaces; MAC addresses, GUIDs and PCI addresses are read in
any case.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(ts: list[Table]) -> str:
    parts = [HEADER]
    for t in ts:
        name = f"[[{t.path}]]" if t.array else f"[{t.path}]"
        parts.append(f"\n## `{name}`\n\n{t.meaning}\n\n")
        parts.append("| key | type | default | meaning |\n|---|---|---|---|\n")
        for k in t.keys:
            cells = (f"`{k.key}`", k.type, k.default, k.meaning)
            parts.append("| " + " | ".join(_cell(c) for c in cells) + " |\n")
    parts.append(_guide())
    return "".join(parts)


def _guide() -> str:
    """The examples and what rdmad does not do (rdmad/configguide.py), as rdmad.toml(5)
    shows them too."""
    parts = [
        "\n## Examples\n\n"
        "Whole config files of real setups (each passes `rdmad check-config`); one can be "
        "a drop-in of its own in `/etc/rdmad/rdmad.d/`.\n"
    ]
    for ex in EXAMPLES:
        parts.append(f"\n### {ex.title}\n\n{ex.text}\n\n```toml\n{ex.toml}```\n")
    parts.append("\n## What rdmad does not do\n\n")
    parts.extend(f"* **{subject}.** {what}\n" for subject, what in NOT_DONE)
    return "".join(parts)


def page() -> str:
    """The page as the schema and the descriptions make it now."""
    return render(tables())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(PAGE), help="the page to write; - prints it")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page differs")
    args = ap.parse_args(argv)
    try:
        text = page()
    except SchemaError as exc:
        print(f"configref: {exc}", file=sys.stderr)
        return 1
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is not what the schema makes; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/LOGS.md lists exactly the events the daemon logs, each with its level and fields:
the events are read from the code (every call on a module's structlog logger), so a new
event, a renamed one or a field added or dropped fails here until the page says so."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from rdmad.model.actions import Blocked, InUseDrift, Unsupported

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"debug": "debug", "info": "info", "warning": "warning", "error": "error"}
LEVELS["exception"] = "error"  # structlog's exception(): error, with the traceback

# Event names made at run time, and every name each makes. Each was read off its code:
#   reporting.py  log.warning(f"object.{kind}")  for the kinds of Blocked, InUseDrift,
#                 Unsupported (log_notes logs only those)
#   runner.py     log.error(f"{what}.failed")    what: "observe" or "plan" (_failed)
DYNAMIC = {
    "object.{kind}": {f"object.{c.kind}" for c in (Blocked, InUseDrift, Unsupported)},
    "{what}.failed": {"observe.failed", "plan.failed"},
}


@dataclass
class Event:
    levels: set[str] = field(default_factory=set)
    fields: set[str] = field(default_factory=set)
    where: list[str] = field(default_factory=list)


def _structlog_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to structlog.get_logger(...)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "get_logger"
                and isinstance(f.value, ast.Name)
                and f.value.id == "structlog"
            ):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _dict_keys(func: ast.AST, name: str) -> set[str]:
    """The keys of ``name = dict(k=...)`` (or a ``{"k": ...}`` literal) in a function."""
    for node in ast.walk(func):
        value = None
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = node.value if node.target.id == name else None
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "dict":
            return {k.arg for k in value.keywords if k.arg}
        if isinstance(value, ast.Dict):
            return {k.value for k in value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"cannot read the fields of **{name}")


def events_in_code() -> dict[str, Event]:
    found: dict[str, Event] = {}
    for path in sorted((ROOT / "rdmad").rglob("*.py")):
        tree = ast.parse(path.read_text())
        loggers = _structlog_names(tree)
        if not loggers:
            continue
        funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in loggers
            ):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert node.func.attr in LEVELS, f"{where}: log.{node.func.attr}() is not a level"
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value}
            elif isinstance(first, ast.JoinedStr):
                pattern = "".join(
                    v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                    for v in first.values
                )
                assert pattern in DYNAMIC, f"{where}: an event name made at run time: {pattern}"
                names = DYNAMIC[pattern]
            else:
                raise AssertionError(f"{where}: the event name is not a string")
            fields: set[str] = set()
            for kw in node.keywords:
                if kw.arg is not None:
                    fields.add(kw.arg)
                else:
                    assert isinstance(kw.value, ast.Name), where
                    inside = [f for f in funcs if f.lineno <= node.lineno <= (f.end_lineno or 0)]
                    fields |= _dict_keys(inside[-1], kw.value.id)
            for name in names:
                event = found.setdefault(name, Event())
                event.levels.add(LEVELS[node.func.attr])
                event.fields |= fields
                event.where.append(where)
    return found


ROW = re.compile(r"^\| `([a-z_.-]+)` \| ([a-z, ]+) \| (.*?) \| (.+) \|$")


def events_in_docs() -> dict[str, Event]:
    text = (ROOT / "docs" / "LOGS.md").read_text()
    listed = text.split("\nThe list below is every event", 1)[1]
    found: dict[str, Event] = {}
    for line in listed.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        name, levels, fields, _ = m.groups()
        assert name not in found, f"docs/LOGS.md lists {name} twice"
        found[name] = Event(
            levels={lv.strip() for lv in levels.split(",")},
            fields=set(re.findall(r"`([a-z_]+)`", fields)),
        )
    return found


def test_the_scan_finds_the_events_operators_grep_for() -> None:
    code = events_in_code()
    for name in ("config.loaded", "reconcile.pass", "agent.ready", "kernel.change"):
        assert name in code
    assert code["kernel.change"].fields >= {"obj", "target", "old", "new", "reason", "cause"}
    assert len(code) > 50


def test_docs_list_every_event_the_code_logs_and_no_other() -> None:
    code, docs = events_in_code(), events_in_docs()
    missing = {n: e.where for n, e in code.items() if n not in docs}
    assert not missing, f"events logged but not in docs/LOGS.md: {missing}"
    extra = sorted(set(docs) - set(code))
    assert not extra, f"docs/LOGS.md lists events the code does not log: {extra}"


def test_each_event_has_its_level_and_fields_on_the_page() -> None:
    code, docs = events_in_code(), events_in_docs()
    for name, event in code.items():
        listed = docs[name]
        assert listed.levels == event.levels, (name, listed.levels, event.levels, event.where)
        assert listed.fields == event.fields, (name, listed.fields, event.fields, event.where)


def test_the_page_is_shipped_and_named_by_the_man_page() -> None:
    docs = (ROOT / "packaging" / "deb" / "debian" / "rdmad.docs").read_text().split()
    assert "docs/LOGS.md" in docs
    from rdmad import manpages

    assert "LOGS.md" in manpages.RDMAD_SECTIONS

"""docs/CONFIG-REFERENCE.md is what `python -m rdmad.configref` makes from the config
schema and its descriptions: every key, its type, default and meaning."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import pytest

from rdmad import configref
from rdmad.model import Desired


def test_the_checked_in_page_is_what_the_schema_makes() -> None:
    current = configref.PAGE.read_text() if configref.PAGE.exists() else ""
    assert current == configref.page(), (
        f"{configref.PAGE.name} is not what the schema makes; "
        f"regenerate it: .venv/bin/{configref.COMMAND}"
    )


def _paths(spec: type[msgspec.Struct], prefix: str) -> set[str]:
    """Every key path of the schema, walked here on its own."""
    out = set()
    for f in msgspec.structs.fields(spec):
        path = f"{prefix}.{f.name}"
        out.add(path)
        tp = configref._optional(f.type)[0]
        if (sub := configref._array_of(tp) or configref._struct(tp)) is not None:
            out |= _paths(sub, path)
    return out


def test_every_key_of_the_schema_is_on_the_page() -> None:
    keys = {f"{t.path}.{k.key}" for t in configref.tables() for k in t.keys}
    expected = set()
    for f in msgspec.structs.fields(Desired):
        tp = configref._struct(f.type) or configref._array_of(f.type)
        assert tp is not None
        expected |= _paths(tp, f.name)
    assert keys == expected
    assert {"daemon.settle", "sriov.vf.mac", "rxe.netdev.pci", "peermem.mode"} <= keys


def test_a_key_without_a_description_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    descriptions = dict(configref.DESCRIPTIONS)
    del descriptions["sriov.vf.trust"]
    monkeypatch.setattr(configref, "DESCRIPTIONS", descriptions)
    with pytest.raises(configref.SchemaError, match=r"sriov\.vf\.trust: no description"):
        configref.page()
    assert configref.main(["--out", "-"]) == 1


def test_a_description_of_a_key_the_schema_lacks_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    descriptions = {**configref.DESCRIPTIONS, "daemon.gone": "a key that was removed"}
    monkeypatch.setattr(configref, "DESCRIPTIONS", descriptions)
    with pytest.raises(configref.SchemaError, match=r"does not have.*daemon\.gone"):
        configref.page()


def test_a_type_the_page_cannot_name_is_an_error() -> None:
    with pytest.raises(configref.SchemaError, match="cannot name"):
        configref.type_name(dict[str, int])
    with pytest.raises(configref.SchemaError, match="cannot name"):
        configref.type_name(int | str | None)


def test_types_and_defaults_read_as_the_config_writes_them() -> None:
    assert configref.type_name(Annotated[int, msgspec.Meta(ge=0, le=7)] | None) == (
        "integer, >= 0, <= 7"
    )
    daemon = next(t for t in configref.tables() if t.path == "daemon")
    by_key = {k.key: k for k in daemon.keys}
    assert (by_key["settle"].type, by_key["settle"].default) == ("duration, <= 10 s", '`"150ms"`')
    assert by_key["drift_interval"].default == '`"5m"`'
    sriov = next(t for t in configref.tables() if t.path == "sriov")
    assert {k.key: k.default for k in sriov.keys}["numvfs"] == "required"


def test_check_says_how_to_regenerate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "CONFIG-REFERENCE.md"
    stale.write_text("# old\n")
    assert configref.main(["--check", "--out", str(stale)]) == 1
    assert configref.COMMAND in capsys.readouterr().err
    assert configref.main(["--out", str(stale)]) == 0
    assert configref.main(["--check", "--out", str(stale)]) == 0

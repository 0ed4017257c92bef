"""Data -> the config's Structs (rdmad.model.validation): every error with its key path,
the normalizing checks, and nothing but SpecError on any input."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad.model import DaemonSpec, Desired, SriovSpec, VfSpec
from rdmad.model.desired import VfBlock
from rdmad.model.validation import SpecError, render, validate


def problems(spec: type[Any], data: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as exc:
        validate(spec, data)
    return [(render(loc), msg) for loc, msg in exc.value.problems]


def test_every_bad_value_is_reported_not_only_the_first() -> None:
    got = problems(
        VfSpec,
        {"index": -1, "mac": "zz", "vlan": "x", "trust": "maybe", "link_state": "on", "x": 1},
    )
    assert got == [
        ("index", "must be an integer >= 0, not -1"),
        ("mac", "not a MAC address (want xx:xx:xx:xx:xx:xx): 'zz'"),
        ("vlan", "expected an integer, got a string"),
        ("trust", "expected true or false, got a string"),
        ("link_state", "must be one of 'auto', 'enable', 'disable', not 'on'"),
        ("x", "unknown key"),
    ]


def test_paths_reach_into_tables_and_arrays() -> None:
    got = problems(
        Desired,
        {
            "sriov": [
                {"pf": {"pci": "0000:3b:00.0"}, "numvfs": 2, "vf": [{"index": 0}, {"qos": 1}]},
                {"pf": {}, "numvfs": 1},
            ],
            "rxe": "rxe0",
            "daemon": [],
        },
    )
    assert got == [
        ("sriov[0].vf[1].index", "required key is missing"),
        ("sriov[1].pf", "a netdev reference needs exactly one of name, mac, pci; got 0"),
        ("rxe", "expected an array, got a string"),
        ("daemon", "expected a table, got an array"),
    ]


def test_rules_across_fields_run_once_the_fields_are_valid() -> None:
    # qos without vlan is a rule of the VF as a whole: reported at the VF, not at a key
    assert problems(VfSpec, {"index": 0, "qos": 3}) == [
        ("", "qos and vlan_proto need vlan to be set as well")
    ]
    # ... and not reported while a field is itself invalid (its own error says enough)
    assert problems(VfSpec, {"index": 0, "qos": 9}) == [("qos", "must be an integer <= 7, not 9")]


def test_checks_normalize_and_strings_are_stripped() -> None:
    vf = validate(
        VfSpec, {"index": 3, "mac": " 02:AA:bb:00:00:01 ", "node_guid": "00:11:22:33:44:55:66:77"}
    )
    assert (vf.index, vf.mac, vf.node_guid) == (3, "02:aa:bb:00:00:01", "00:11:22:33:44:55:66:77")
    d = validate(DaemonSpec, {"settle": "50ms", "drift_interval": "5m", "startup_timeout": 2})
    assert (d.settle, d.drift_interval, d.startup_timeout) == (0.05, 300.0, 2.0)
    assert problems(DaemonSpec, {"drift_interval": "500ms"}) == [
        ("drift_interval", "must be a number >= 1.0, not 0.5")
    ]
    assert problems(DaemonSpec, {"settle": True}) == [("settle", "not a duration: True")]


def test_the_result_is_frozen_hashable_and_its_defaults_are_fresh() -> None:
    s = validate(SriovSpec, {"pf": {"name": "eth0"}, "numvfs": 2, "vf": [{"index": 1}]})
    assert s.vf == (VfBlock(index=1),) and hash(s) == hash(
        validate(SriovSpec, msgspec.to_builtins(s))
    )
    with pytest.raises(AttributeError):
        s.numvfs = 3  # type: ignore[misc]
    assert validate(Desired, {}) == Desired() and Desired().daemon == DaemonSpec()


# Anything TOML can hold, in the places the schema looks and elsewhere.
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.sampled_from(["auto", "02:00:00:00:00:01", "0000:3b:00.0", "eth0", "5m", "report"])
)
_ANY = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["index", "mac", "vlan", "qos", "pf", "name", "pci", "numvfs", "vf", "x"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
_DOC = st.dictionaries(
    st.sampled_from(["daemon", "api", "metrics", "rxe", "sriov", "peermem", "other"]),
    _ANY,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(_DOC)
def test_any_document_gives_desired_or_spec_error_never_another_exception(doc: Any) -> None:
    try:
        d = validate(Desired, doc)
    except SpecError as exc:
        assert exc.problems and all(isinstance(msg, str) and msg for _, msg in exc.problems)
    else:
        assert isinstance(d, Desired)
        assert validate(Desired, msgspec.to_builtins(d)) == d  # what it gives, it takes back

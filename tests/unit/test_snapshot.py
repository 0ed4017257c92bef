"""snapshot(): live state in config format; a snapshot plans nothing on its node."""

from __future__ import annotations

import dataclasses
import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad import config
from rdmad.model import (
    IbVfSettings,
    Observed,
    PlanState,
    RdmaLinkObserved,
    VfSettings,
)
from rdmad.reconcile import plan
from rdmad.snapshot import snapshot
from tests.unit.test_reconcile import node, pf


def round_trip(observed: Observed) -> tuple[str, list[object]]:
    text = snapshot(observed, header="test")
    desired, errors = config.parse([("snapshot.toml", tomllib.loads(text))])
    assert desired is not None, errors
    return text, plan(desired, observed, PlanState())  # type: ignore[return-value]


def test_snapshot_of_a_hand_set_node() -> None:
    p = pf(numvfs=2, ib=True)
    vf0 = dataclasses.replace(
        p.vfs[0],
        driver="vfio-pci",
        settings=VfSettings(
            "02:00:00:00:00:09", 100, 3, "802.1ad", False, True, "disable", 10, 1000, True
        ),
        ib=IbVfSettings("00:11:22:33:44:55:66:77", "00:11:22:33:44:55:66:78", "Up"),
    )
    o = node(
        dataclasses.replace(p, vfs=(vf0, p.vfs[1])),
        rdma=(
            RdmaLinkObserved("rxe0", "rxe", "eth0"),
            RdmaLinkObserved("mlx5_0", "mlx5_core", "ens1f0"),
        ),
    )
    text, actions = round_trip(o)
    assert actions == []
    assert 'pf = { pci = "0000:3b:00.0" }' in text
    assert 'vlan_proto = "802.1ad"' in text and 'driver = "vfio-pci"' in text
    assert 'node_guid = "00:11:22:33:44:55:66:77"' in text
    assert '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }' in text
    assert "mlx5_0" not in text.split("[[rxe]]")[-1]  # only rxe links are declared


def test_pf_without_vfs_is_not_declared() -> None:
    text = snapshot(node(pf(numvfs=0)))
    assert "[[sriov]]" not in text


SETTINGS = st.builds(
    VfSettings,
    mac=st.sampled_from(["00:00:00:00:00:00", "02:00:00:00:00:01", "52:54:00:aa:bb:cc"]),
    vlan=st.integers(0, 4094),
    qos=st.integers(0, 7),
    vlan_proto=st.sampled_from(["802.1Q", "802.1ad"]),
    spoofchk=st.booleans(),
    trust=st.booleans(),
    link_state=st.sampled_from(["auto", "enable", "disable"]),
    min_tx_rate=st.just(0),
    max_tx_rate=st.integers(0, 100000),
    query_rss=st.booleans(),
)


@settings(max_examples=200)
@given(st.integers(1, 8), st.data())
def test_any_snapshot_plans_nothing(count: int, data: st.DataObject) -> None:
    p = pf(numvfs=count, totalvfs=8)
    vfs = []
    for v in p.vfs:
        s = data.draw(SETTINGS)
        if s.vlan == 0:  # the kernel reports qos 0 / 802.1Q without a VLAN
            s = dataclasses.replace(s, qos=0, vlan_proto="802.1Q")
        vfs.append(dataclasses.replace(v, settings=s))
    _, actions = round_trip(node(dataclasses.replace(p, vfs=tuple(vfs))))
    assert actions == []

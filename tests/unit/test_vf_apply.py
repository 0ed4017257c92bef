"""VF apply logic (vf_apply.apply_vf_changes) with a scripted kernel: fallback and read-back."""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.nlsock import NetlinkFailure
from rdmad.kernel.netlink.vf_apply import Piece, apply_vf_changes
from rdmad.model import VfChange, VfSettings


class ScriptedPf:
    """Accepts every piece except (vf, attr label) pairs in ``refuse``; keeps ``keeps``."""

    def __init__(self, refuse: Mapping[tuple[int, str], int] | None = None) -> None:
        self.refuse = dict(refuse or {})
        self.sent: list[list[tuple[int, str]]] = []
        self.vfs: dict[int, dict[str, object]] = {}
        self.keeps: dict[tuple[int, str], object] = {}  # what the driver really holds

    async def send(self, pieces: Sequence[Piece]) -> NetlinkFailure | None:
        self.sent.append([(p.vf, p.attr.label) for p in pieces])
        for p in pieces:  # in order, stopping at the first refusal, as the kernel does
            code = self.refuse.get((p.vf, p.attr.label))
            if code:
                return NetlinkFailure(code, "")
            for c in p.changes:
                self.vfs.setdefault(p.vf, {})[c.attr] = self.keeps.get((p.vf, c.attr), c.new)
        return None

    async def read_back(self) -> Mapping[int, VfSettings]:
        return {vf: VfSettings(**values) for vf, values in self.vfs.items()}  # type: ignore[arg-type]


CHANGES = [
    VfChange(0, "trust", None, True),
    VfChange(0, "link_state", None, "enable"),
    VfChange(1, "trust", None, True),
    VfChange(1, "link_state", None, "enable"),
]


async def test_accepted_batch_is_one_message_and_verified() -> None:
    pf = ScriptedPf()
    results = await apply_vf_changes(pf.send, pf.read_back, "pf0", CHANGES, {})
    assert [r.ok for r in results] == [True] * 4
    assert len(pf.sent) == 1


async def test_refused_attribute_is_found_per_vf_then_per_attribute() -> None:
    pf = ScriptedPf({(1, "link_state"): errno.EOPNOTSUPP})
    results = await apply_vf_changes(pf.send, pf.read_back, "pf0", CHANGES, {})
    assert [r.ok for r in results] == [True, True, True, False]
    err = results[3].error
    assert err is not None and err.errno == errno.EOPNOTSUPP
    assert str(err).startswith("set vf 1 link_state on pf0: operation not supported")
    assert "cannot force a VF's link state" in str(err)
    # batch, VF 0 alone, VF 1 alone, then VF 1 one attribute at a time
    assert pf.sent[1:] == [
        [(0, "link_state"), (0, "trust")],
        [(1, "link_state"), (1, "trust")],
        [(1, "link_state")],
        [(1, "trust")],
    ]


async def test_value_the_driver_did_not_keep_is_reported_per_attribute() -> None:
    pf = ScriptedPf()
    pf.keeps[(3, "max_tx_rate")] = 0
    changes = [VfChange(3, "max_tx_rate", None, 100), VfChange(3, "trust", None, True)]
    results = await apply_vf_changes(pf.send, pf.read_back, "pf0", changes, {})
    assert results[1].ok
    assert str(results[0].error) == "vf 3 max_tx_rate: wrote 100, reads 0"


async def test_failed_read_back_marks_written_changes_unverified() -> None:
    pf = ScriptedPf()

    async def broken() -> Mapping[int, VfSettings]:
        raise KernelError("read ifindex 4", "this host", errno.ENODEV)

    results = await apply_vf_changes(pf.send, broken, "ifindex 4", CHANGES[:1], {})
    assert "could not be read back" in str(results[0].error)


async def test_vf_missing_from_read_back_is_a_failure() -> None:
    pf = ScriptedPf()

    async def empty() -> Mapping[int, VfSettings]:
        return {}

    results = await apply_vf_changes(pf.send, empty, "pf0", CHANGES[:1], {})
    assert str(results[0].error) == (
        "vf 0 trust: wrote True, the VF is missing from the PF's VF list read back"
    )


async def test_nothing_written_means_no_read_back() -> None:
    pf = ScriptedPf()
    reads = 0

    async def counting() -> Mapping[int, VfSettings]:
        nonlocal reads
        reads += 1
        return {}

    results = await apply_vf_changes(
        pf.send, counting, "pf0", [VfChange(0, "vlan", None, 9999)], {}
    )
    assert not results[0].ok and reads == 0 and pf.sent == []

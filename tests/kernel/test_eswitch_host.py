"""KernelHost and the eSwitch: observe() attaches each PF's eSwitch and its VFs'
representors from devlink; apply(SetEswitch) sends one request per option, mode first,
re-checks a mode change against the VFs' use right before it, and records each option's
own answer; a dry run records the same writes. The devlink client against this
machine's kernel: the family is found, a PF without a devlink instance has no eSwitch."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

from rdmad.kernel.apply.dryrun import RecordingHost
from rdmad.kernel.apply.results import Outcome
from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.devlink import NO_FAMILY, Devlink, NoDevlink, PfSeen
from rdmad.kernel.netlink.devlink_codec import handle
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import EswitchObserved, SetEswitch
from tests.kernel.test_host import make_host, tree  # noqa: F401  (tree: a fixture)
from tests.support.fakesysfs import IGB_PF, MLX5_PF


class FakeDevlink:
    def __init__(self, seen: dict[str, PfSeen], refuse: dict[str, int] | None = None) -> None:
        self.seen = seen
        self.refuse = refuse or {}
        self.sent: list[tuple[str, dict[str, str]]] = []

    async def read_pfs(self, pfs: Iterable[tuple[str, str | None]]) -> dict[str, PfSeen]:
        return {pf: self.seen[pf] for pf, _ in pfs if pf in self.seen}

    async def set_eswitch(self, pf: str, **options: str) -> None:
        (option,) = options
        if option in self.refuse:
            raise KernelError("set the eSwitch", f"pci/{pf}", self.refuse[option])
        self.sent.append((pf, options))

    def close(self) -> None:
        pass


SWITCHDEV = EswitchObserved("switchdev", "none", "basic")


async def test_observe_attaches_eswitch_and_representors(tree: Path) -> None:  # noqa: F811
    devlink = FakeDevlink({MLX5_PF: PfSeen(SWITCHDEV, {0: "pf0vf0", 1: "pf0vf1"})})
    host = make_host(tree, devlink=devlink)
    observed = await host.observe()
    mlx5 = next(p for p in observed.pfs if p.pci == MLX5_PF)
    assert mlx5.eswitch == SWITCHDEV
    assert [(v.index, v.representor) for v in mlx5.vfs][:3] == [
        (0, "pf0vf0"),
        (1, "pf0vf1"),
        (2, None),
    ]
    igb = next(p for p in observed.pfs if p.pci == IGB_PF)
    assert igb.eswitch is None  # not in the devlink answer: not read


async def test_set_eswitch_one_request_per_option_each_its_answer(tree: Path) -> None:  # noqa: F811
    devlink = FakeDevlink({}, refuse={"inline_mode": errno.EOPNOTSUPP})
    host = make_host(tree, devlink=devlink)
    action = SetEswitch(
        "o",
        "r",
        pci=IGB_PF,
        changes=(("mode", "legacy", "switchdev"), ("inline_mode", "none", "transport")),
    )
    result = await host.apply(action)
    assert result.outcome is Outcome.PARTIAL
    assert devlink.sent == [(IGB_PF, {"mode": "switchdev"})]
    mode, inline = result.writes
    assert (mode.target, mode.ok) == (f"{IGB_PF} eswitch mode", True)
    assert inline.error is not None and inline.error.errno == errno.EOPNOTSUPP

    dry = RecordingHost(host.observe, Sysfs(tree))
    recorded = await dry.apply(action)
    assert [(w.target, w.old, w.new) for w in recorded.writes] == [
        (w.target, w.old, w.new) for w in result.writes
    ]


async def test_a_mode_change_under_a_vf_taken_since_the_plan_is_stale(tree: Path) -> None:  # noqa: F811
    # The fake tree's mlx5 VF 1 is held by a VM (pid 4242) that started after the plan.
    devlink = FakeDevlink({})
    host = make_host(tree, devlink=devlink)
    action = SetEswitch("o", "r", pci=MLX5_PF, changes=(("mode", "legacy", "switchdev"),))
    result = await host.apply(action)
    assert result.stale and "pid 4242 (qemu-system-x86)" in result.note
    assert devlink.sent == [] and not host.records
    # An inline mode alone leaves the vports as they are: not re-checked, sent.
    inline = SetEswitch("o", "r", pci=MLX5_PF, changes=(("inline_mode", "none", "link"),))
    assert (await host.apply(inline)).outcome is Outcome.APPLIED
    assert devlink.sent == [(MLX5_PF, {"inline_mode": "link"})]


def test_devlink_handles() -> None:
    assert handle("0000:3b:00.0") == ("pci", "0000:3b:00.0")
    assert handle("netdevsim1") == ("netdevsim", "netdevsim1")


async def test_the_real_kernel_a_pf_without_an_instance_has_no_eswitch() -> None:
    """This machine's kernel: a PCI address devlink has no instance for (there is no
    such device) is a PF without an eSwitch, never an unknown one. Kernels built
    without devlink (some VM kernels) say that instead; the lab's 6.1 guest has it."""
    devlink = Devlink()
    try:
        try:
            devices: set[tuple[str, str]] | None = await devlink.devices()
        except NoDevlink:
            devices = None
        seen = await devlink.read_pfs([("0000:ff:1f.7", "igb")])
    finally:
        devlink.close()
    got = seen["0000:ff:1f.7"].eswitch
    assert got.mode is None and got.unread is None
    if devices is None:
        assert got.absent == NO_FAMILY
    else:
        assert ("pci", "0000:ff:1f.7") not in devices
        assert got.absent == "igb registers no devlink instance for 0000:ff:1f.7"

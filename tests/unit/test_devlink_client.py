"""The devlink client's reading of each PF (kernel/netlink/devlink.Devlink.read_pfs) over a
scripted transport: the replies are the codec's own messages, the kernel's answers
what a driver with, without and half without an eSwitch gives. What it decides: no
devlink instance or EOPNOTSUPP is "no eSwitch"; any other failure is unknown; a kernel
without devlink is asked once; representors are read in switchdev mode only, and
only the ports of the PF asked about count."""

from __future__ import annotations

import asyncio
import errno
import struct
import threading

import pytest

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink import devlink_codec as dl
from rdmad.kernel.netlink.devlink import NO_FAMILY, Devlink
from rdmad.kernel.netlink.nlcodec import NlMsg, asciiz, attr, nested, split_messages
from rdmad.kernel.netlink.nlsock import NetlinkFailure

FAMILY = 0x15
PCI = "0000:3b:00.0"


def message(cmd: int, *attrs: bytes) -> NlMsg:
    (one,) = split_messages(dl.genl(FAMILY, cmd, 0, 0, b"".join(attrs)))
    return one


def device(bus: str, dev: str) -> bytes:
    return attr(dl.ATTR_BUS_NAME, asciiz(bus)) + attr(dl.ATTR_DEV_NAME, asciiz(dev))


def port(bus: str, dev: str, index: int, vf: int, netdev: str) -> NlMsg:
    return message(
        dl.CMD_PORT_NEW,
        device(bus, dev),
        attr(dl.ATTR_PORT_INDEX, struct.pack("=I", index)),
        attr(dl.ATTR_PORT_FLAVOUR, struct.pack("=H", 4)),  # pcivf
        attr(dl.ATTR_PORT_PCI_VF_NUMBER, struct.pack("=H", vf)),
        attr(dl.ATTR_PORT_NETDEV_NAME, asciiz(netdev)),
    )


class Script:
    """A transport answering by request: the genl command (or the controller). A
    command in ``held`` is answered only once its event is set, as the kernel answers
    a request sent while another process's eSwitch change holds the device."""

    def __init__(
        self,
        answers: dict[int, list[NlMsg] | int],
        held: dict[int, threading.Event] | None = None,
    ) -> None:
        self.answers = answers
        self.held = held or {}
        self.asked: list[int] = []
        self.threads: set[str] = set()

    def request_blocking(
        self, mtype: int, flags: int, payload: bytes, reply_wait: float
    ) -> list[NlMsg]:
        key = -1 if mtype == dl.GENL_ID_CTRL else payload[0]
        self.asked.append(key)
        self.threads.add(threading.current_thread().name)
        if key in self.held:
            assert self.held[key].wait(30), "held for the whole test"
        answer = self.answers[key]
        if isinstance(answer, int):
            raise NetlinkFailure(answer, "scripted")
        return answer

    def close(self) -> None:
        pass


def family() -> list[NlMsg]:
    (one,) = split_messages(
        dl.genl(
            dl.GENL_ID_CTRL,
            1,
            0,
            0,
            attr(dl.CTRL_ATTR_FAMILY_ID, struct.pack("=H", FAMILY))
            + nested(dl.CTRL_ATTR_MCAST_GROUPS, []),
        )
    )
    return [one]


def client(
    answers: dict[int, list[NlMsg] | int],
    held: dict[int, threading.Event] | None = None,
    **deadlines: float,
) -> tuple[Devlink, Script]:
    script = Script(answers, held)
    return Devlink(transport=script, **deadlines), script  # type: ignore[arg-type]


async def test_switchdev_pf_with_its_representors_only() -> None:
    eswitch = message(
        dl.CMD_ESWITCH_GET,
        device("pci", PCI),
        attr(dl.ATTR_ESWITCH_MODE, struct.pack("=H", 1)),
        attr(dl.ATTR_ESWITCH_INLINE_MODE, b"\x01"),
    )
    d, _ = client(
        {
            -1: family(),
            dl.CMD_GET: [message(dl.CMD_NEW, device("pci", PCI))],
            dl.CMD_ESWITCH_GET: [eswitch],
            dl.CMD_PORT_GET: [
                port("pci", PCI, 1, 0, "pf0vf0"),
                port("pci", "0000:af:00.0", 1, 0, "other0"),  # an unfiltered dump's
                port("pci", PCI, 2, 1, "pf0vf1"),
            ],
        }
    )
    seen = (await d.read_pfs([(PCI, "mlx5_core")]))[PCI]
    assert (seen.eswitch.mode, seen.eswitch.inline_mode) == ("switchdev", "link")
    assert seen.representors == {0: "pf0vf0", 1: "pf0vf1"}


async def test_legacy_reads_no_ports_and_no_instance_is_no_eswitch() -> None:
    eswitch = message(dl.CMD_ESWITCH_GET, device("pci", PCI), attr(dl.ATTR_ESWITCH_MODE, b"\0\0"))
    d, script = client(
        {
            -1: family(),
            dl.CMD_GET: [message(dl.CMD_NEW, device("pci", PCI))],
            dl.CMD_ESWITCH_GET: [eswitch],
        }
    )
    seen = await d.read_pfs([(PCI, "mlx5_core"), ("0000:01:00.0", "igb")])
    assert seen[PCI].eswitch.mode == "legacy" and seen[PCI].representors == {}
    assert dl.CMD_PORT_GET not in script.asked
    igb = seen["0000:01:00.0"].eswitch
    assert igb.mode is None and igb.unread is None
    assert igb.absent == "igb registers no devlink instance for 0000:01:00.0"


async def test_eopnotsupp_is_no_eswitch_other_errors_unknown() -> None:
    for code, unknown in ((errno.EOPNOTSUPP, False), (errno.ENOMEM, True)):
        d, _ = client(
            {
                -1: family(),
                dl.CMD_GET: [message(dl.CMD_NEW, device("pci", PCI))],
                dl.CMD_ESWITCH_GET: code,
            }
        )
        got = (await d.read_pfs([(PCI, "bnxt_en")]))[PCI].eswitch
        assert got.mode is None
        assert (got.unread is not None) is unknown, got
        assert (got.absent == "bnxt_en has none") is (not unknown), got


async def test_a_failed_device_list_is_unknown_for_every_pf() -> None:
    d, _ = client({-1: family(), dl.CMD_GET: errno.EINTR})
    seen = await d.read_pfs([(PCI, "mlx5_core"), ("netdevsim1", "netdevsim")])
    assert sorted(seen) == [PCI, "netdevsim1"]  # every PF answered for (all() of none holds)
    assert all(s.eswitch.unread and s.eswitch.mode is None for s in seen.values())


async def test_a_kernel_without_devlink_is_asked_once() -> None:
    d, script = client({-1: errno.ENOENT})
    for _ in range(3):
        seen = await d.read_pfs([(PCI, "mlx5_core")])
        assert seen[PCI].eswitch.absent == NO_FAMILY and seen[PCI].eswitch.unread is None
    assert script.asked == [-1]


LEGACY_ANSWERS: dict[int, list[NlMsg] | int] = {
    -1: family(),
    dl.CMD_GET: [message(dl.CMD_NEW, device("pci", PCI))],
    dl.CMD_ESWITCH_GET: [
        message(dl.CMD_ESWITCH_GET, device("pci", PCI), attr(dl.ATTR_ESWITCH_MODE, b"\0\0"))
    ],
    dl.CMD_ESWITCH_SET: [],
}


async def test_a_mode_change_runs_off_the_event_loop() -> None:
    gate = threading.Event()
    d, script = client(LEGACY_ANSWERS, {dl.CMD_ESWITCH_SET: gate})
    write = asyncio.ensure_future(d.set_eswitch(PCI, mode="switchdev"))
    ticks = 0
    while dl.CMD_ESWITCH_SET not in script.asked:  # the kernel has the request
        await asyncio.sleep(0.01)
        ticks += 1
        assert ticks < 3000
    for _ in range(5):  # the loop keeps running while the kernel works on it
        await asyncio.sleep(0)
    assert not write.done()
    gate.set()
    await asyncio.wait_for(write, 30)
    assert threading.main_thread().name not in script.threads


async def test_a_read_behind_a_stuck_request_is_unread_and_nothing_more_is_sent() -> None:
    gate = threading.Event()
    d, script = client(LEGACY_ANSWERS, {dl.CMD_ESWITCH_GET: gate}, read_deadline=0.2)
    try:
        first = (await d.read_pfs([(PCI, "mlx5_core")]))[PCI].eswitch
        assert first.mode is None and first.unread is not None
        assert "did not answer within 0.2 s" in first.unread
        asked = len(script.asked)
        second = (await d.read_pfs([(PCI, "mlx5_core")]))[PCI].eswitch
        assert second.unread is not None and "has not returned after" in second.unread
        assert len(script.asked) == asked  # nothing sent beside the stuck request
    finally:
        gate.set()
    for _ in range(3000):  # bounded: the stuck request returns, then reads work again
        seen = (await d.read_pfs([(PCI, "mlx5_core")]))[PCI].eswitch
        if seen.unread is None:
            break
        await asyncio.sleep(0.01)
    assert seen.mode == "legacy", seen


async def test_a_write_past_its_deadline_fails_saying_so() -> None:
    gate = threading.Event()
    d, _ = client(LEGACY_ANSWERS, {dl.CMD_ESWITCH_SET: gate}, write_deadline=0.2)
    try:
        with pytest.raises(KernelError) as caught:
            await d.set_eswitch(PCI, mode="switchdev")
    finally:
        gate.set()
    assert caught.value.errno == errno.ETIMEDOUT
    assert "the kernel may still complete it" in str(caught.value)

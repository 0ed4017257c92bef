"""kernel.events.reflex: an rxe add sent by the event reader, answered by a fake kernel end.

The fake kernel is the other end of a datagram socket pair: it reads the NEWLINK the
reflex sent and answers with the NLMSG_ERROR the kernel would (0: an ack). The reflex's
part on a real kernel is in tests/lab/test_rxe_persistence.py.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad.kernel.events.reflex import RELEASE_WAIT, RxeReflex
from rdmad.kernel.netlink.nlcodec import NLMSG_ERROR, iter_attrs, pack_message
from rdmad.kernel.netlink.rdma_codec import CMD_NEWLINK, nldev_type
from rdmad.kernel.pause import write_pause
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import AddRxe
from tests.support.fakeclock import FakeClock

HEADER = struct.Struct("=IHHII")
ADD = AddRxe(obj="rxe rxe0", name="rxe0", netdev="eth0", reason="declared rxe link is missing")


class FakeKernel:
    """The kernel's end of the reflex's socket."""

    def __init__(self) -> None:
        self.mine: socket.socket | None = None
        self.opened: list[socket.socket] = []

    def open(self) -> socket.socket:
        """A new socket per add, as the reflex opens one per add; ours is its peer."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        mine.setblocking(False)
        theirs.setblocking(False)  # as open_netlink_socket's
        self.mine = mine
        self.opened += [mine, theirs]
        return theirs

    def request(self) -> tuple[int, int, dict[int, bytes]] | None:
        """(type, seq, attributes) of the next message sent, or None."""
        if self.mine is None:
            return None
        try:
            data = self.mine.recv(65536)
        except BlockingIOError:
            return None
        _length, mtype, _flags, seq, _pid = HEADER.unpack_from(data, 0)
        return mtype, seq, dict(iter_attrs(data[HEADER.size :]))

    def answer(self, seq: int, code: int) -> None:
        """NLMSG_ERROR with -code (0: ack) and the request's header, as the kernel sends."""
        assert self.mine is not None
        self.mine.send(pack_message(NLMSG_ERROR, 0, seq, struct.pack("=i", -code) + bytes(16)))

    def answer_next(self, code: int) -> tuple[int, int, dict[int, bytes]]:
        """Answer the next message sent (there must be one) with -code; returns it."""
        request = self.request()
        assert request is not None, "nothing was sent"
        self.answer(request[1], code)
        return request

    def close(self) -> None:
        for sock in self.opened:
            sock.close()


@pytest.fixture
def kernel() -> Iterator[FakeKernel]:
    k = FakeKernel()
    yield k
    k.close()


@pytest.fixture
def sysfs(tmp_path: Path) -> Sysfs:
    (tmp_path / "sys/module/ib_core").mkdir(parents=True)
    (tmp_path / "sys/class/net/eth0").mkdir(parents=True)
    return Sysfs(tmp_path)


def names(attrs: dict[int, bytes]) -> set[str]:
    return {v.rstrip(b"\0").decode() for v in attrs.values()}


async def settle(fut: asyncio.Future[object]) -> None:
    for _ in range(100):
        if fut.done():
            return
        await asyncio.sleep(0)
    raise AssertionError("the reflex's outcome never came")


async def refusal(reflex: RxeReflex, sends: int = 1) -> int:
    """The errno the kernel refused ADD with (after ``sends`` sends)."""
    firing = reflex.take(ADD)
    assert firing is not None
    await settle(firing.outcome)
    failure = firing.outcome.result()
    assert failure is not None and firing.sends == sends
    return failure.errno


def armed(
    sysfs: Sysfs, kernel: FakeKernel, clock: FakeClock, gate_says: bool = True
) -> tuple[RxeReflex, list[AddRxe]]:
    asked: list[AddRxe] = []

    def gate(action: AddRxe) -> bool:
        asked.append(action)
        return gate_says

    reflex = RxeReflex(sysfs, clock, opener=kernel.open)
    reflex.arm({"eth0": [ADD]}, {"rxe0": [ADD]}, gate)
    return reflex, asked


async def test_a_new_netdev_sends_the_add_at_once_and_the_pass_takes_the_outcome(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    clock = FakeClock()
    reflex, asked = armed(sysfs, kernel, clock)
    reflex.netdev_added("eth9")  # not awaited: nothing
    assert kernel.opened == []
    reflex.netdev_added("eth0")
    assert asked == [ADD] and reflex.fired == 1
    request = kernel.request()
    assert request is not None
    mtype, seq, attrs = request
    assert mtype == nldev_type(CMD_NEWLINK)
    assert names(attrs) == {"rxe0", "rxe", "eth0"}
    kernel.answer(seq, 0)
    firing = reflex.take(ADD)
    assert firing is not None and firing.sends == 1
    await settle(firing.outcome)
    assert firing.outcome.result() is None and firing.sock is None
    assert reflex.take(ADD) is None  # taken once
    reflex.netdev_added("eth0")  # fired once per arming
    assert kernel.request() is None


async def test_the_removal_of_its_device_sends_again_while_the_name_is_released(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    clock = FakeClock()
    reflex, _ = armed(sysfs, kernel, clock)
    reflex.rdma_removed("rxe0")
    firing = reflex.take(ADD)
    assert firing is not None
    for code in (errno.EEXIST, errno.ENFILE):
        request = kernel.request()
        assert request is not None
        kernel.answer(request[1], code)
        for _ in range(20):  # the reader callback runs, the retry is armed
            await asyncio.sleep(0)
        assert not firing.outcome.done() and kernel.request() is None
        clock.advance(0.005)
    kernel.answer_next(0)
    await settle(firing.outcome)
    assert firing.outcome.result() is None and firing.sends == 3


async def test_taken_for_a_new_netdev_or_past_the_release_wait_is_the_passs_to_decide(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    clock = FakeClock()
    reflex, _ = armed(sysfs, kernel, clock)
    reflex.netdev_added("eth0")  # a new netdev: EEXIST means a link is really there
    kernel.answer_next(errno.EEXIST)
    assert await refusal(reflex) == errno.EEXIST

    reflex.arm({}, {"rxe0": [ADD]}, lambda a: True)
    reflex.rdma_removed("rxe0")
    firing = reflex.take(ADD)
    assert firing is not None
    while not firing.outcome.done():
        request = kernel.request()
        if request is not None:
            kernel.answer(request[1], errno.EEXIST)
        await asyncio.sleep(0)
        clock.advance(0.005)
        assert clock.monotonic() - firing.started <= RELEASE_WAIT + 0.01
    failure = firing.outcome.result()
    assert failure is not None and failure.errno == errno.EEXIST
    assert 10 < firing.sends <= RELEASE_WAIT / 0.005 + 2


async def test_a_kernel_refusal_is_the_outcome(sysfs: Sysfs, kernel: FakeKernel) -> None:
    reflex, _ = armed(sysfs, kernel, FakeClock())
    reflex.rdma_removed("rxe0")
    kernel.answer_next(errno.ENODEV)
    assert await refusal(reflex) == errno.ENODEV


async def test_nothing_is_sent_when_the_gate_says_no_disarmed_paused_netdev_gone_or_no_ib_core(
    tmp_path: Path, sysfs: Sysfs, kernel: FakeKernel
) -> None:
    clock = FakeClock()
    reflex, asked = armed(sysfs, kernel, clock, gate_says=False)
    reflex.netdev_added("eth0")
    assert asked == [ADD] and reflex.take(ADD) is None

    reflex, asked = armed(sysfs, kernel, clock)
    reflex.disarm()
    reflex.netdev_added("eth0")
    reflex.rdma_removed("rxe0")
    assert asked == [] and not reflex.armed

    # The rxe device went with its netdev (deleted): its removal's uevent can come
    # before the link news.
    reflex, asked = armed(sysfs, kernel, clock)
    (tmp_path / "sys/class/net/eth0").rmdir()
    reflex.rdma_removed("rxe0")
    assert asked == [] and reflex.take(ADD) is None
    (tmp_path / "sys/class/net/eth0").mkdir()

    reflex, asked = armed(sysfs, kernel, clock)
    write_pause(sysfs, by="test", reason="a guarded stop", seconds=60, modules=[], now=clock.wall())
    reflex.netdev_added("eth0")
    assert asked == []

    bare = Sysfs(tmp_path / "no-ib-core")
    reflex, asked = armed(bare, kernel, clock)
    reflex.rdma_removed("rxe0")
    assert asked == []
    assert kernel.opened == [] and kernel.request() is None


async def test_a_socket_that_cannot_open_is_the_outcome_and_close_ends_a_firing(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    def refuse() -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "no RDMA netlink")

    reflex = RxeReflex(sysfs, FakeClock(), opener=refuse)
    reflex.arm({"eth0": [ADD]}, {}, lambda a: True)
    reflex.netdev_added("eth0")
    firing = reflex.take(ADD)
    assert firing is not None and firing.outcome.done()
    failure = firing.outcome.result()
    assert failure is not None and failure.errno == errno.EPROTONOSUPPORT
    assert firing.sends == 0  # nothing went out

    reflex, _ = armed(sysfs, kernel, FakeClock())
    reflex.netdev_added("eth0")  # sent, never answered
    reflex.close()
    firing = reflex.take(ADD)
    assert firing is None  # close() drops what no pass took...
    assert kernel.request() is not None  # ...after it was sent


async def test_arming_again_forgets_answered_outcomes_no_pass_took(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    reflex, _ = armed(sysfs, kernel, FakeClock())
    reflex.netdev_added("eth0")
    kernel.answer_next(0)
    for _ in range(20):
        await asyncio.sleep(0)
    reflex.arm({"eth0": [ADD]}, {}, lambda a: True)
    assert reflex.take(ADD) is None


# --- on this machine's kernel: the readers' hooks, as the daemon wires them -----------


async def test_a_real_new_netdevs_news_fires_the_reflex_as_it_is_read(
    sysfs: Sysfs, kernel: FakeKernel, veth_names: tuple[str, str]
) -> None:
    from rdmad.daemon import _wire_reflexes
    from rdmad.kernel.apply.host import KernelHost
    from rdmad.kernel.events.linkevents import LinkEventStream

    name, peer = veth_names
    add = AddRxe(obj="rxe rxv", name="rxv", netdev=name, reason="declared rxe link is missing")
    host = KernelHost("/")
    host.reflex = RxeReflex(sysfs, FakeClock(), opener=kernel.open)
    async with LinkEventStream() as stream:
        _wire_reflexes(host, [stream])
        host.arm_reflexes({name: [add]}, {}, lambda a: True, lambda a: None)
        proc = await asyncio.create_subprocess_exec(
            "ip", "link", "add", name, "type", "veth", "peer", "name", peer
        )
        assert await proc.wait() == 0
        seen = None
        for _ in range(50):  # bounded: a veth pair is a handful of messages
            event = await asyncio.wait_for(stream.__anext__(), 10)
            if event.kind == "add" and event.name == name:
                seen = event
                break
        assert seen is not None
        # Sent by the reader as it read the news (the fake kernel end has the request).
        request = kernel.request()
        assert request is not None and names(request[2]) == {"rxv", "rxe", name}
        firing = host.reflex.take(add)
        assert firing is not None and firing.sends == 1
    host.close()


async def test_the_daemon_wires_the_kernels_rdma_removal_to_the_reflex(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    from rdmad.daemon import _wire_reflexes
    from rdmad.kernel.apply.host import KernelHost
    from rdmad.kernel.events.udev import WANTED, UdevEvent
    from rdmad.kernel.events.uevents import KernelUevents

    host = KernelHost("/")
    host.reflex = RxeReflex(sysfs, FakeClock(), opener=kernel.open)
    reader = KernelUevents({"infiniband": WANTED["infiniband"]})
    try:
        _wire_reflexes(host, [reader])
        assert reader.on_event is not None
        host.arm_reflexes({}, {"rxe0": [ADD]}, lambda a: True, lambda a: None)
        ib = "/devices/virtual/infiniband"
        reader.on_event(UdevEvent("add", "infiniband", "rxe0", f"{ib}/rxe0", source="kernel"))
        assert kernel.request() is None  # an add is not a removal
        reader.on_event(UdevEvent("remove", "infiniband", "rxe0", f"{ib}/rxe0", source="kernel"))
        request = kernel.request()
        assert request is not None and names(request[2]) == {"rxe0", "rxe", "eth0"}
    finally:
        reader.close()
        host.close()


async def test_a_gate_that_raises_sends_nothing_and_the_reader_goes_on(
    sysfs: Sysfs, kernel: FakeKernel
) -> None:
    def broken(action: AddRxe) -> bool:
        raise RuntimeError("a bug")

    reflex = RxeReflex(sysfs, FakeClock(), opener=kernel.open)
    reflex.arm({"eth0": [ADD]}, {}, broken)
    reflex.netdev_added("eth0")  # does not raise into the reader
    assert kernel.request() is None and reflex.take(ADD) is None


async def test_answered_waits_for_every_outcome_bounded(sysfs: Sysfs, kernel: FakeKernel) -> None:
    reflex, _ = armed(sysfs, kernel, FakeClock())
    await asyncio.wait_for(reflex.answered(5), 1)  # nothing sent: at once
    reflex.netdev_added("eth0")
    request = kernel.request()
    assert request is not None
    waiting = asyncio.ensure_future(reflex.answered(5))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done()
    kernel.answer(request[1], 0)
    await asyncio.wait_for(waiting, 5)
    reflex.arm({"eth0": [ADD]}, {}, lambda a: True)
    reflex.netdev_added("eth0")  # never answered: the bound ends the wait
    await asyncio.wait_for(reflex.answered(0.05), 5)
    firing = reflex.take(ADD)
    assert firing is not None and not firing.outcome.done()
    reflex.close()


class AnsweringKernel(FakeKernel):
    """A kernel end that answers within the send, as the kernel does for netlink."""

    def __init__(self, codes: list[int]) -> None:
        super().__init__()
        self.codes = codes  # one answer per send, in order

    def open(self) -> socket.socket:
        theirs = super().open()
        kernel = self

        class Answered(socket.socket):
            def send(self, data: bytes, flags: int = 0) -> int:  # type: ignore[override]
                sent = super().send(data, flags)
                kernel.answer_next(kernel.codes.pop(0))
                return sent

        sock = Answered(fileno=theirs.detach())
        sock.setblocking(False)
        self.opened.append(sock)
        return sock


async def test_the_kernels_answer_within_the_send_is_read_at_once(sysfs: Sysfs) -> None:
    """An ack: the outcome is there when the reader's hook returns, without a turn of
    the loop; a refusal while the name is released: the retry is armed at once too."""
    ack = AnsweringKernel([0])
    try:
        reflex = RxeReflex(sysfs, FakeClock(), opener=ack.open)
        reflex.arm({"eth0": [ADD]}, {}, lambda action: True)
        reflex.netdev_added("eth0")
        firing = reflex.take(ADD)
        assert firing is not None and firing.outcome.done()
        assert firing.outcome.result() is None and firing.sock is None
    finally:
        ack.close()
    clock = FakeClock()
    released = AnsweringKernel([errno.ENFILE, 0])
    try:
        reflex = RxeReflex(sysfs, clock, opener=released.open)
        reflex.arm({}, {"rxe0": [ADD]}, lambda action: True)
        reflex.rdma_removed("rxe0")
        firing = reflex.take(ADD)
        assert firing is not None and not firing.outcome.done()
        assert firing.retry is not None  # armed within the hook, not by the reader later
        clock.advance(0.005)
        await settle(firing.outcome)
        assert firing.outcome.result() is None and firing.sends == 2
    finally:
        released.close()


async def test_the_claim_is_told_only_when_the_kernel_made_the_link(sysfs: Sysfs) -> None:
    """``made`` (the agent's claim) comes after the send, in the hook that read the ack;
    never for an add the kernel refused, once for one made after a retry."""
    made: list[AddRxe] = []
    sent_before: list[bool] = []
    kernel = AnsweringKernel([0])

    def claim(action: AddRxe) -> None:
        made.append(action)
        sent_before.append(kernel.codes == [])  # the send (and its answer) came first

    try:
        reflex = RxeReflex(sysfs, FakeClock(), opener=kernel.open)
        reflex.arm({"eth0": [ADD]}, {}, lambda action: True, claim)
        reflex.netdev_added("eth0")
        assert made == [ADD] and sent_before == [True]  # when the hook returned
    finally:
        kernel.close()

    made.clear()
    refused = AnsweringKernel([errno.EEXIST])  # a new netdev: a link is really there
    try:
        reflex = RxeReflex(sysfs, FakeClock(), opener=refused.open)
        reflex.arm({"eth0": [ADD]}, {}, lambda action: True, claim)
        reflex.netdev_added("eth0")
        firing = reflex.take(ADD)
        assert firing is not None and firing.outcome.done() and firing.outcome.result()
        assert made == []
    finally:
        refused.close()

    clock = FakeClock()
    released = AnsweringKernel([errno.ENFILE, errno.EEXIST, 0])
    try:
        reflex = RxeReflex(sysfs, clock, opener=released.open)
        reflex.arm({}, {"rxe0": [ADD]}, lambda action: True, claim)
        reflex.rdma_removed("rxe0")
        firing = reflex.take(ADD)
        assert firing is not None and made == []  # refused while the name is released
        for _ in range(400):  # the release wait (1 s) is 200 steps of 5 ms
            if firing.outcome.done():
                break
            clock.advance(0.005)
            await asyncio.sleep(0)
        assert firing.outcome.done() and firing.outcome.result() is None
        assert firing.sends == 3
        assert made == [ADD]  # once
    finally:
        released.close()


def test_a_request_socket_is_answered_unbound() -> None:
    """``open_request_socket`` on this machine's kernel: non-blocking and close-on-exec
    from its creation, bound by the kernel at the send, and the request's answer comes
    back to it (an RTM_GETLINK of the loopback, acked)."""
    from rdmad.kernel.netlink.nlcodec import NLM_F_ACK, NLM_F_REQUEST, split_messages
    from rdmad.kernel.netlink.nlsock import open_request_socket, recv_nowait

    sock = open_request_socket(socket.NETLINK_ROUTE)
    with sock:
        assert sock.getblocking() is False and sock.get_inheritable() is False
        assert sock.getsockname()[0] == 0  # not bound yet
        rtm_getlink = 18
        ifinfo = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 1, 0, 0)  # index 1: lo
        sock.send(pack_message(rtm_getlink, NLM_F_REQUEST | NLM_F_ACK, 7, ifinfo))
        assert sock.getsockname()[0] != 0  # the kernel bound it
        answer = None
        buf = bytearray(65536)
        for _ in range(100):  # bounded; the kernel answers within the send
            data = recv_nowait(sock, buf)
            if data is None:
                break
            for msg in split_messages(data):
                if msg.type == NLMSG_ERROR and msg.seq == 7:
                    answer = struct.unpack_from("=i", msg.data)[0]
        assert answer == 0, "the kernel's ack came back to the unbound socket"

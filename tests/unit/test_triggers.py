"""Triggers and batches: what a pass learns about the events it answers."""

from __future__ import annotations

from rdmad.triggers import MAX_IFINDEXES, Trigger, TriggerQueue
from tests.support.fakeclock import FakeClock


def test_batch_is_narrow_only_when_every_trigger_is() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add veth0", narrow=True, touches=frozenset({"veth0", "ifindex:7"})))
    q.put(Trigger("udev", "add net veth1", narrow=True, touches=frozenset({"ifindex:8"})))
    q.put(Trigger("udev", "remove infiniband rxe0", narrow=True, rdma=True))
    b = q.take()
    assert b is not None and b.narrow and b.rdma and b.ifindexes == {7, 8}
    q.put(Trigger("netlink", "add veth2", narrow=True, touches=frozenset({"ifindex:9"})))
    q.put(Trigger("udev", "add pci 0000:00:03.0"))
    b = q.take()
    assert b is not None and not b.narrow


def test_a_narrow_trigger_naming_no_netdev_makes_the_pass_read_them_all() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add veth0", narrow=True, touches=frozenset({"ifindex:7"})))
    q.put(Trigger("netlink", "change", narrow=True))
    b = q.take()
    assert b is not None and b.narrow and b.ifindexes is None
    for i in range(MAX_IFINDEXES + 1):
        q.put(Trigger("netlink", "add", narrow=True, touches=frozenset({f"ifindex:{i + 1}"})))
    b = q.take()
    assert b is not None and b.ifindexes is None


def test_urgent_is_kept_by_the_batch() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("udev", "add pci"))
    q.put(Trigger("followup", "verify", urgent=True))
    b = q.take()
    assert b is not None and b.urgent and not b.narrow

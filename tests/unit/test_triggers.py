"""Triggers and batches: what a pass learns about the events it answers."""

from __future__ import annotations

from rdmad.triggers import Trigger, TriggerQueue
from tests.support.fakeclock import FakeClock


def test_batch_is_narrow_only_when_every_trigger_is() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add veth0", narrow=True, touches=frozenset({"veth0", "ifindex:7"})))
    q.put(Trigger("udev", "add net veth1", narrow=True, touches=frozenset({"ifindex:8"})))
    q.put(Trigger("udev", "remove infiniband rxe0", narrow=True, rdma=True))
    b = q.take()
    assert b is not None and b.narrow and b.rdma
    q.put(Trigger("netlink", "add veth2", narrow=True, touches=frozenset({"ifindex:9"})))
    q.put(Trigger("udev", "add pci 0000:00:03.0"))
    b = q.take()
    assert b is not None and not b.narrow


def test_urgent_is_kept_by_the_batch() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("udev", "add pci"))
    q.put(Trigger("followup", "verify", urgent=True))
    b = q.take()
    assert b is not None and b.urgent and not b.narrow

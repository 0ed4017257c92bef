"""rxe links and the (dummy) nvidia / nvidia-peermem modules on a real 6.1 kernel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import Guest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]


@pytest.fixture
def veth(guest: Guest) -> Iterator[tuple[str, str]]:
    guest.check("ip link add labv0 type veth peer name labv1")
    yield "labv0", "labv1"
    guest.run("ip link del labv0")


def _rxe_names(guest: Guest) -> set[str]:
    return {link["ifname"] for link in guest.rdma_links()}


def test_rxe_link_add_and_delete(guest: Guest, veth: tuple[str, str]) -> None:
    assert guest.check("rdma link add rxe0 type rxe netdev labv0") == ""

    links = guest.rdma_links()
    assert [(lk["ifname"], lk["netdev"]) for lk in links] == [("rxe0", "labv0")]
    assert "rxe0" in guest.check("ibv_devices")

    guest.check("rdma link delete rxe0")
    assert _rxe_names(guest) == set()
    assert "rxe0" not in guest.check("ibv_devices")


def test_modprobe_r_rdma_rxe_removes_every_link(guest: Guest, veth: tuple[str, str]) -> None:
    guest.check(
        "rdma link add rxe0 type rxe netdev labv0 && rdma link add rxe1 type rxe netdev labv1"
    )
    assert _rxe_names(guest) == {"rxe0", "rxe1"}

    res = guest.modprobe("rdma_rxe", remove=True)

    assert res.ok, res.describe()  # no refusal while links exist
    assert _rxe_names(guest) == set()
    assert not guest.module_loaded("rdma_rxe")


def test_udev_module_events_for_dummy_nvidia_modules(guest: Guest) -> None:
    log = "/run/lab-udev-module.log"
    unit = guest.start_unit(
        "lab-udevmon",
        f"exec udevadm monitor --kernel --subsystem-match=module > {log} 2>&1",
        max_seconds=300,
    )
    guest.wait_for(f"grep -q 'monitor will print' {log}", timeout=30)

    guest.check("modprobe nvidia-peermem")
    guest.check("modprobe -r nvidia_peermem nvidia")

    for event in (
        "add      /module/nvidia (module)",
        "add      /module/nvidia_peermem (module)",
        "remove   /module/nvidia_peermem (module)",
        "remove   /module/nvidia (module)",
    ):
        guest.wait_for(f"grep -qF '{event}' {log}", timeout=30)
    guest.stop_unit(unit)


def test_nvidia_peermem_depends_on_ib_core_and_nvidia(guest: Guest) -> None:
    depends = guest.check("modinfo -F depends nvidia-peermem").strip().split(",")
    assert sorted(depends) == ["ib_core", "nvidia"]

    guest.check("modprobe nvidia-peermem")
    assert guest.module_loaded("nvidia") and guest.module_loaded("ib_core")
    assert guest.exists("/sys/module/ib_core/holders/nvidia_peermem")

    res = guest.modprobe("ib_core", remove=True)
    assert not res.ok
    assert "in use" in res.err, res.describe()

    # rdma_rxe going away leaves peermem alone (LAB.md).
    guest.check("modprobe rdma_rxe && modprobe -r rdma_rxe")
    assert guest.module_loaded("nvidia_peermem")

    guest.check("modprobe -r nvidia_peermem")
    assert not guest.exists("/sys/module/ib_core/holders/nvidia_peermem")

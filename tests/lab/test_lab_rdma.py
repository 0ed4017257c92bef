"""rxe links and the (dummy) nvidia / nvidia-peermem modules on a real 6.1 kernel."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
from harness import Guest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]


@pytest.fixture
def veth(guest: Guest) -> tuple[str, str]:
    guest.check("ip link add labv0 type veth peer name labv1")
    return "labv0", "labv1"


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


def _rdmad_json(guest: Guest, body: str, timeout: float = 120.0) -> Any:
    """Run ``async def main()`` (returns something JSON) with rdmad installed in the guest."""
    import harness

    python = harness.install_rdmad(guest)
    script = (
        "import asyncio, json\n"
        "from rdmad.kernel.netlink.rdma import RdmaNetlink\n"
        + textwrap.dedent(body)
        + "\nprint(json.dumps(asyncio.run(main())))\n"
    )
    res = guest.run([python, "-c", script], timeout=timeout)
    assert res.ok, res.describe()
    return json.loads(res.out.strip().splitlines()[-1])


_USAGE = """
async def main():
    rdma = RdmaNetlink()
    assert rdma.available(), rdma.reason
    out = {l.name: [l.usage.state.value, list(l.usage.holders)] for l in await rdma.links()}
    rdma.close()
    return out
"""


def test_rdma_usage_baseline_is_free_and_a_verbs_user_is_named(
    guest: Guest, veth: tuple[str, str]
) -> None:
    guest.check("rdma link add rxe0 type rxe netdev labv0")
    guest.wait_for("rdma res show qp | grep -q rxe0", timeout=30)  # ib_core's own QP(s)
    # What an idle rxe device holds (measured: only ib_core's objects; printed for -rP).
    baseline = {
        kind: [
            {k: o.get(k) for k in ("lqpn", "type", "comm", "pid")}
            for o in guest.json(f"rdma -j -d res show {kind}")
            if o.get("ifname") == "rxe0"
        ]
        for kind in ("qp", "cq", "pd")
    }
    print("idle rxe0 baseline:", json.dumps(baseline))
    # Measured (6.1, rxe on a veth): 1 QP (lqpn 1, GSI), 1 CQ, 1 PD, all ib_core's.
    owners = {(o["comm"], o["pid"]) for objs in baseline.values() for o in objs}
    assert owners == {("ib_core", None)}, baseline
    assert [o["lqpn"] for o in baseline["qp"]] == [1], baseline

    idle = _rdmad_json(guest, _USAGE)
    assert idle["rxe0"] == ["free", []], (idle, baseline)

    unit = guest.start_unit("lab-pingpong", "exec ibv_rc_pingpong -g 1 -d rxe0", max_seconds=300)
    guest.wait_for("rdma res show qp | grep -q ibv_rc_pingpong", timeout=60)
    pid = guest.unit_pid(unit)
    print(
        "with ibv_rc_pingpong:", guest.check("rdma res show qp; rdma res show cq; rdma res show pd")
    )
    busy = _rdmad_json(guest, _USAGE)
    state, holders = busy["rxe0"]
    assert state == "in-use", busy
    assert any(h.startswith(f"pid {pid} (ibv_rc_pingpo") and "1 QP" in h for h in holders), (
        busy,
        guest.check("rdma -d res show qp"),
    )

    guest.stop_unit(unit)
    guest.wait_for("! rdma res show qp | grep -q ibv_rc_pingpong", timeout=60)
    assert _rdmad_json(guest, _USAGE)["rxe0"] == ["free", []]


def test_observing_never_loads_ib_core(fresh_guest: Guest) -> None:
    guest = fresh_guest
    assert not guest.module_loaded("ib_core"), "the fresh guest already has ib_core"
    seen = _rdmad_json(
        guest,
        """
        from rdmad.kernel.apply.host import KernelHost
        async def main():
            rdma = RdmaNetlink()
            available, reason = rdma.available(), rdma.reason
            async with KernelHost() as host:
                observed = await host.observe()
            return {"available": available, "reason": reason,
                    "rdma_links": [l.name for l in observed.rdma_links],
                    "rdma_netlink": observed.rdma_netlink,
                    "notes": list(observed.notes)}
        """,
    )
    # The guest's kernel ships ib_core: rxe stays possible, but nothing is listed or loaded.
    assert seen["available"] is True and seen["reason"] is None, seen
    assert seen["rdma_links"] == [] and seen["rdma_netlink"] is True, seen
    assert not guest.module_loaded("ib_core"), seen
    assert not guest.module_loaded("ib_uverbs")

    # While ib_core is still out, a kernel that cannot give RDMA netlink: the kernel's
    # module loader answers for the family nothing registered (kernel.modprobe pointed
    # at /bin/false), to a client whose tree says ib_core is loaded, so it opens the
    # socket. The kernel's own refusal (EPROTONOSUPPORT) must read as "no NETLINK_RDMA".
    loader = guest.read("/proc/sys/kernel/modprobe")
    guest.check("echo /bin/false > /proc/sys/kernel/modprobe")
    try:
        refused = _rdmad_json(
            guest,
            """
            import os, tempfile
            async def main():
                root = tempfile.mkdtemp()
                os.makedirs(f"{root}/sys/module/ib_core")
                rdma = RdmaNetlink(root=root)
                try:
                    return {"available": rdma.available(), "reason": rdma.reason}
                finally:
                    rdma.close()
            """,
        )
    finally:
        guest.check(f"echo {loader} > /proc/sys/kernel/modprobe")
    assert refused == {
        "available": False,
        "reason": "the kernel has no RDMA netlink (NETLINK_RDMA)",
    }, refused
    assert not guest.module_loaded("ib_core")

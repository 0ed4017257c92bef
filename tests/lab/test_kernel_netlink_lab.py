"""rdmad.kernel.netlink.rtnetlink and rdmad.kernel.netlink.rdma against the real kernel of the
QEMU lab guest.

Each test runs one Python script inside the guest (rdmad installed there by the lab
harness) that does the kernel work and prints a JSON verdict; the host asserts on it.

Uses the harness's ``lab_guest`` fixture and ``install_rdmad(guest)``, which returns the
guest python that has rdmad and its dependencies.
"""

from __future__ import annotations

import importlib
import json
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.lab


@pytest.fixture
def guest(lab_guest: Any) -> Any:
    return lab_guest


_PRELUDE = textwrap.dedent(
    """
    import asyncio, errno, glob, json, os, subprocess, time
    from rdmad.kernel.netlink.rtnetlink import RtNetlink
    from rdmad.kernel.netlink.rdma import RdmaNetlink
    from rdmad.kernel.errors import KernelError
    from rdmad.model import VfChange, VfSettings

    def sh(cmd):
        subprocess.run(cmd, shell=True, check=True)

    def write(path, value):
        with open(path, "w") as f:  # close() inside: a failed write raises here
            f.write(str(value))

    def netdevsim(dev_id, numvfs):
        sh("modprobe netdevsim")
        base = f"/sys/bus/netdevsim/devices/netdevsim{dev_id}"
        if not os.path.exists(base):
            write("/sys/bus/netdevsim/new_device", f"{dev_id} 1")
        if not os.path.ismount("/sys/kernel/debug"):
            sh("mount -t debugfs none /sys/kernel/debug")
        write(f"/sys/kernel/debug/netdevsim/netdevsim{dev_id}/max_vfs", max(numvfs, 4))
        write(f"{base}/sriov_numvfs", 0)
        write(f"{base}/sriov_numvfs", numvfs)
        # udev renames the new netdev (eth1 -> eni...); read its name once udev is done.
        sh("udevadm settle --timeout=30")
        deadline = time.monotonic() + 10
        while not glob.glob(f"{base}/net/*") and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.path.basename(glob.glob(f"{base}/net/*")[0])

    def ifindex_of(dev):
        return int(open(f"/sys/class/net/{dev}/ifindex").read())

    def ip_vfs(dev):
        out = subprocess.run(["ip", "-j", "-d", "link", "show", dev], capture_output=True,
                             text=True, check=True).stdout
        return json.loads(out)[0].get("vfinfo_list", [])

    def settings_json(s):
        return None if s is None else {k: getattr(s, k) for k in s.__slots__}
    """
)


def _guest_python(guest: Any, body: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run PRELUDE + body (an ``async def main()`` returning a dict) in the guest."""
    harness = importlib.import_module("tests.lab.harness")  # the lab harness's helpers

    python = harness.install_rdmad(guest) or "python3"
    script = _PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(asyncio.run(main())))\n"
    result = guest.run([str(python), "-c", script], timeout=timeout)
    assert result.returncode == 0, f"guest script failed:\n{result.stdout}\n{result.stderr}"
    last = result.stdout.strip().splitlines()[-1]
    verdict: dict[str, Any] = json.loads(last)
    return verdict


FULL = {
    "mac": "02:00:00:00:01:{vf:02x}",
    "vlan": 100,
    "qos": 3,
    "vlan_proto": "802.1ad",
    "spoofchk": True,
    "trust": True,
    "link_state": "disable",
    "min_tx_rate": 10,
    "max_tx_rate": 900,
    "query_rss": True,
}


def test_netdevsim_full_attribute_set_in_one_batch(guest: Any) -> None:
    verdict = _guest_python(
        guest,
        f"""
        FULL = {FULL!r}
        async def main():
            pf = netdevsim(11, 8)
            rt = RtNetlink()
            sent = []
            real = rt._nl.request
            async def counting(mtype, flags, payload):
                sent.append(mtype)
                return await real(mtype, flags, payload)
            rt._nl.request = counting
            changes = [
                VfChange(vf, k, None, v.format(vf=vf) if isinstance(v, str) and k == "mac" else v)
                for vf in range(8) for k, v in FULL.items()
            ]
            results = await rt.set_vf_settings(pf, changes, {{}})
            [link] = [l for l in await rt.links() if l.name == pf]
            return {{
                "errors": [str(r.error) for r in results if not r.ok],
                "setlinks": sent.count(19),
                "num_vf": link.num_vf,
                "complete": link.vfs_complete,
                "vfs": {{str(i): settings_json(s) for i, s in link.vfs.items()}},
            }}
        """,
    )
    assert verdict["errors"] == []
    assert verdict["setlinks"] == 1, "the changes must travel as one batched RTM_SETLINK"
    assert verdict["num_vf"] == 8 and verdict["complete"]
    for vf in range(8):
        got = verdict["vfs"][str(vf)]
        for key, want in FULL.items():
            expected = str(want).format(vf=vf) if key == "mac" else want
            assert got[key] == expected, (vf, key, got)


def test_igb_rejects_per_attribute_and_applies_the_rest(guest: Any) -> None:
    verdict = _guest_python(
        guest,
        """
        async def main():
            [pci] = [p for p in glob.glob("/sys/bus/pci/drivers/igb/0000:*")
                     if os.path.exists(p + "/sriov_totalvfs")]
            write(pci + "/sriov_numvfs", 0)
            write(pci + "/sriov_numvfs", 2)
            pf = os.listdir(pci + "/net")[0]
            rt = RtNetlink()
            changes = [
                VfChange(1, "mac", None, "02:00:00:00:02:01"),
                VfChange(1, "vlan", None, 42),
                VfChange(1, "qos", None, 2),
                VfChange(1, "spoofchk", None, False),
                VfChange(1, "trust", None, True),
                VfChange(1, "link_state", None, "enable"),
                VfChange(1, "query_rss", None, True),
                VfChange(1, "max_tx_rate", None, 100),
            ]
            results = await rt.set_vf_settings(pf, changes, {})
            [link] = [l for l in await rt.links() if l.name == pf]
            return {
                "results": {r.change.attr: [r.error and r.error.errno, str(r.error)]
                            for r in results},
                "vf1": settings_json(link.vfs.get(1)),
            }
        """,
    )
    res = verdict["results"]
    for attr in ("mac", "vlan", "qos", "spoofchk", "trust"):
        assert res[attr][0] is None, res[attr]
    assert res["link_state"][0] == 95 and "EOPNOTSUPP" in res["link_state"][1]
    assert res["query_rss"][0] == 95
    assert res["max_tx_rate"][0] == 22 and "set vf 1 max_tx_rate" in res["max_tx_rate"][1]
    vf1 = verdict["vf1"]
    assert (vf1["mac"], vf1["vlan"], vf1["qos"]) == ("02:00:00:00:02:01", 42, 2)
    assert (vf1["spoofchk"], vf1["trust"]) == (False, True)


def test_256_netdevsim_vfs_read_back_complete(guest: Any) -> None:
    verdict = _guest_python(
        guest,
        """
        async def main():
            pf = netdevsim(12, 256)
            rt = RtNetlink()
            start = time.monotonic()
            [link] = [l for l in await rt.links() if l.name == pf]
            took = time.monotonic() - start
            write("/sys/bus/netdevsim/devices/netdevsim12/sriov_numvfs", 0)
            return {"num_vf": link.num_vf, "entries": len(link.vfs),
                    "complete": link.vfs_complete, "seconds": took}
        """,
    )
    assert verdict["num_vf"] == 256
    assert verdict["entries"] == 256 and verdict["complete"], verdict


def test_rxe_add_list_delete_and_eexist(guest: Any) -> None:
    verdict = _guest_python(
        guest,
        """
        async def main():
            pf = netdevsim(13, 0)
            rdma = RdmaNetlink()
            assert rdma.available(), rdma.reason
            await rdma.add_link("rxet0", "rxe", pf)
            listed = [(l.name, l.driver, l.netdev, l.netdev_ifindex) for l in await rdma.links()]
            errors = {}
            for label, args in (("same_name", ("rxet0", "rxe", pf)),
                                ("same_netdev", ("rxet1", "rxe", pf)),
                                ("no_netdev", ("rxet2", "rxe", "nosuch0"))):
                try:
                    await rdma.add_link(*args)
                    errors[label] = None
                except KernelError as exc:
                    errors[label] = [exc.errno, str(exc)]
            await rdma.delete_link("rxet0")
            after = [l.name for l in await rdma.links()]
            try:
                await rdma.delete_link("rxet0")
                again = None
            except KernelError as exc:
                again = [exc.errno, str(exc)]
            ifindex = int(open(f"/sys/class/net/{pf}/ifindex").read())
            return {"listed": listed, "errors": errors, "after": after, "again": again,
                    "pf": pf, "ifindex": ifindex}
        """,
    )
    assert ["rxet0", "rxe", verdict["pf"], verdict["ifindex"]] in verdict["listed"]
    errors = verdict["errors"]
    assert errors["same_netdev"][0] == 17 and "EEXIST" in errors["same_netdev"][1]
    assert errors["same_name"] is not None  # EEXIST (or ENFILE on some kernels)
    assert errors["no_netdev"][0] == 19  # ENODEV
    assert "rxet0" not in verdict["after"]
    assert verdict["again"][0] == 19


def test_vf_index_from_ifla_vf_mac_and_pf_by_ifindex(guest: Any) -> None:
    """Each VF's settings land under the index iproute2 shows for that MAC; PF by ifindex."""
    verdict = _guest_python(
        guest,
        """
        async def main():
            pf = netdevsim(14, 6)
            rt = RtNetlink()
            macs = {vf: f"02:00:00:00:0e:{vf:02x}" for vf in range(6)}
            changes = [VfChange(vf, "mac", None, mac) for vf, mac in macs.items()]
            changes += [VfChange(vf, "max_tx_rate", None, 100 + vf) for vf in range(6)]
            results = await rt.set_vf_settings(ifindex_of(pf), changes, {})
            link = await rt.link(ifindex_of(pf))
            return {
                "errors": [str(r.error) for r in results if not r.ok],
                "ours": {str(i): [s.mac, s.max_tx_rate] for i, s in link.vfs.items()},
                "ip": {str(v["vf"]): [v["address"], v.get("rate", {}).get("max_tx")]
                       for v in ip_vfs(pf)},
            }
        """,
    )
    assert verdict["errors"] == []
    assert verdict["ours"] == verdict["ip"]
    assert verdict["ours"]["5"] == ["02:00:00:00:0e:05", 105]


def test_vlan_without_proto_on_a_fresh_netdevsim_vf_is_8021q(guest: Any) -> None:
    verdict = _guest_python(
        guest,
        """
        async def main():
            pf = netdevsim(15, 2)
            rt = RtNetlink()
            before = (await rt.link(ifindex_of(pf))).vfs
            results = await rt.set_vf_settings(
                ifindex_of(pf), [VfChange(1, "vlan", before[1].vlan, 100)], before
            )
            after = (await rt.link(ifindex_of(pf))).vfs
            [ip_vf1] = [v for v in ip_vfs(pf) if v["vf"] == 1]
            return {
                "before": settings_json(before[1]),
                "errors": [str(r.error) for r in results if not r.ok],
                "after": settings_json(after[1]),
                "ip": ip_vf1.get("vlan_list", ip_vf1),
            }
        """,
    )
    assert verdict["errors"] == []
    # The fresh VF's protocol does not read as 802.1Q or 802.1ad...
    assert verdict["before"]["vlan_proto"] not in ("802.1Q", "802.1ad"), verdict["before"]
    # ...and a declared vlan without a protocol is written as 802.1Q, not 802.1ad.
    assert (verdict["after"]["vlan"], verdict["after"]["vlan_proto"]) == (100, "802.1Q")
    assert "802.1ad" not in json.dumps(verdict["ip"]), verdict["ip"]


def test_the_uevent_filter_attaches_on_the_guests_kernel_and_drops_other_subsystems(
    guest: Any,
) -> None:
    """The guest runs Debian 12's kernel (6.1), whose net.core.optmem_max (20 KiB) refused
    the byte-at-a-time filter with ENOMEM: the daemon's reader then woke for every uevent.
    Here the program attaches with its full search, and the kernel itself drops a veth
    pair's uevents (theirs and their queues') while an rxe device's come through."""
    verdict = _guest_python(
        guest,
        """
        import select, socket
        from rdmad.kernel.events.uevent_filter import attach_uevent_filter

        def raw(subsystems):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)
            span = attach_uevent_filter(sock, subsystems) if subsystems else None
            sock.bind((0, 1))
            return sock, span

        def drain(sock, last):
            seen = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # bounded: 30 s for the last one
                if not select.select([sock], [], [], 1.0)[0]:
                    continue
                fields = sock.recv(8192).split(b"\\0")
                sub = next((f[10:] for f in fields if f.startswith(b"SUBSYSTEM=")), b"")
                seen.append([fields[0].decode(), sub.decode()])
                if fields[0].decode().startswith("remove@") and fields[0].decode().endswith(last):
                    return seen
            raise AssertionError(f"{last} not removed: {seen}")

        async def main():
            sh("modprobe rdma_rxe")
            every, _ = raw(None)
            ours, span = raw(("infiniband", "infiniband_verbs"))
            sh("ip link add flt0 type veth peer name flt1")
            sh("rdma link add rxflt0 type rxe netdev flt0")
            sh("rdma link delete rxflt0")
            sh("ip link del flt0")
            return {
                "optmem_max": int(open("/proc/sys/net/core/optmem_max").read()),
                "span": span,
                "every": drain(every, "/net/flt1"),
                "ours": drain(ours, "/infiniband/rxflt0"),
            }
        """,
    )
    from rdmad.kernel.events.uevent_filter import SCAN

    assert verdict["span"] == SCAN, verdict["optmem_max"]
    every = {sub for _, sub in verdict["every"]}
    assert {"net", "queues", "infiniband"} <= every  # what comes without the filter
    ours = verdict["ours"]
    assert {sub for _, sub in ours} <= {"infiniband", "infiniband_verbs"}, ours
    assert any(h.startswith("add@") and h.endswith("/infiniband/rxflt0") for h, _ in ours), ours


def test_a_pf_netdev_is_udev_pending_until_udevd_has_processed_it(guest: Any) -> None:
    """The observation rdmad's planner keeps a bnxt_en PF down by (it may not set a PF up
    before udev named its netdev: the guest's 6.1, as any kernel before 6.2, refuses to
    rename an interface that is up).
    With udevd's queue stopped, a new netdevsim PF's netdev (down) has no udev database
    entry yet and reads pending; once udevd runs the queue, it is named and not."""
    verdict = _guest_python(
        guest,
        """
        from rdmad.kernel.apply.observe import observe
        from rdmad.kernel.sysfs import Sysfs

        async def pending(rt, pci):
            links = {link.name: link for link in await rt.links()}
            pf = next(p for p in observe(Sysfs("/"), links).pfs if p.pci == pci)
            return {"netdev": pf.netdev, "up": pf.operstate_up, "pending": pf.udev_pending}

        async def main():
            sh("modprobe netdevsim")
            sh("udevadm settle --timeout=30")
            sh("udevadm control --stop-exec-queue")
            try:
                write("/sys/bus/netdevsim/new_device", "23 1")
                base = "/sys/bus/netdevsim/devices/netdevsim23"
                deadline = time.monotonic() + 30
                while not glob.glob(f"{base}/net/*") and time.monotonic() < deadline:
                    time.sleep(0.05)
                rt = RtNetlink()
                before = await pending(rt, "netdevsim23")
            finally:
                sh("udevadm control --start-exec-queue")
            sh("udevadm settle --timeout=30")
            after = await pending(rt, "netdevsim23")
            write("/sys/bus/netdevsim/del_device", "23")
            return {"before": before, "after": after}
        """,
    )
    before, after = verdict["before"], verdict["after"]
    assert before["up"] is False and before["pending"] is True, verdict
    # udevd named it (eth1 -> eni23np1, or kept): no longer pending.
    assert after["up"] is False and after["pending"] is False, verdict
    assert after["netdev"] != before["netdev"] or after["netdev"].startswith("eni"), verdict

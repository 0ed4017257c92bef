"""Guest-side clock for the lab restore benchmarks: when do a PF, its VFs and their settings show?

Copied into the lab guest and run there with the system python3 (stdlib only, so it
costs nothing to import and shares nothing with the code it measures):

    python3 guest_vf_poller.py SPEC.json OUT.json

SPEC: {"pci": BDF of the PF, "numvfs": N, "vfs": {"I": {attr: value}}, "rxe": name or
null, "timeout": s, "interval": s, "ready": path or null, "wait_gone": bool}. Attributes use rdmad's
config vocabulary (mac, vlan, qos, vlan_proto, spoofchk, trust, link_state, min_tx_rate,
max_tx_rate, query_rss).

Every ``interval`` (2 ms) it lists /sys/bus/pci/devices/BDF/net (the PF's netdev, under
whatever name udev gave it) and sends one RTM_GETLINK for that name with
RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS, parses IFLA_VFINFO_LIST and compares every
declared attribute; with ``rxe`` it also checks /sys/class/infiniband/NAME. It writes
CLOCK_MONOTONIC times (``time.monotonic()``, the same clock as the kernel's and
systemd's monotonic stamps in the guest):

* ``t_start``: the poller's first poll; ``pf_at_start``: the PF netdev was already there;
* ``t_pf``: first poll that found the PF netdev;
* ``t_vfs``: first poll that found exactly N VFs on it (the start point of a restore);
* ``t_done``: first poll that found every declared value and the rxe link;
* ``polls`` and ``poll_s`` (mean cost of one poll: the clock's resolution).

With ``wait_gone`` the PF netdev must vanish first (a driver reload), then every time is
of its return. It exits when done or at the timeout (``t_done`` null then, with the last mismatch).
When ``ready`` is set it creates that file after its first poll, so a driver can start
the action once the clock runs.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

RTM_NEWLINK, RTM_GETLINK = 16, 18
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
IFLA_IFNAME, IFLA_NUM_VF, IFLA_VFINFO_LIST, IFLA_EXT_MASK = 3, 21, 22, 29
RTEXT_FILTER_VF, RTEXT_FILTER_SKIP_STATS = 1, 8
VF_MAC, VF_VLAN, VF_SPOOFCHK, VF_LINK_STATE, VF_RATE, VF_RSS, VF_TRUST = 1, 2, 4, 5, 6, 7, 9
VF_VLAN_LIST, VF_VLAN_INFO = 12, 1
LINK_STATES = {0: "auto", 1: "enable", 2: "disable"}
PROTOS = {0x8100: "802.1Q", 0x88A8: "802.1ad"}


def attrs(buf: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Top-level netlink attributes in buf[start:end] -> type: (payload start, payload end)."""
    out = {}
    while start + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, start)
        if length < 4:
            break
        out[kind & 0x3FFF] = (start + 4, start + length)
        start += (length + 3) & ~3
    return out


def vf_list(buf: bytes, start: int, end: int) -> list[dict[str, object]]:
    """IFLA_VFINFO_LIST -> one dict per VF, in the config's vocabulary."""
    vfs = []
    pos = start
    while pos + 4 <= end:
        length, _ = struct.unpack_from("=HH", buf, pos)
        if length < 4:
            break
        a = attrs(buf, pos + 4, pos + length)
        pos += (length + 3) & ~3
        vf: dict[str, object] = {}
        if VF_MAC in a:
            s, _e = a[VF_MAC]
            vf["mac"] = ":".join(f"{b:02x}" for b in buf[s + 4 : s + 10])
        if VF_VLAN in a:
            _, vlan, qos = struct.unpack_from("=III", buf, a[VF_VLAN][0])
            vf["vlan"], vf["qos"], vf["vlan_proto"] = vlan, qos, "802.1Q"
        if VF_VLAN_LIST in a:
            inner = attrs(buf, *a[VF_VLAN_LIST])
            if VF_VLAN_INFO in inner:
                _, vlan, qos = struct.unpack_from("=III", buf, inner[VF_VLAN_INFO][0])
                (proto,) = struct.unpack_from("!H", buf, inner[VF_VLAN_INFO][0] + 12)
                vf["vlan"], vf["qos"] = vlan, qos
                vf["vlan_proto"] = PROTOS.get(proto, hex(proto))
        for key, name in ((VF_SPOOFCHK, "spoofchk"), (VF_TRUST, "trust"), (VF_RSS, "query_rss")):
            if key in a:
                (value,) = struct.unpack_from("=I", buf, a[key][0] + 4)
                vf[name] = None if value == 0xFFFFFFFF else bool(value)
        if VF_LINK_STATE in a:
            (state,) = struct.unpack_from("=I", buf, a[VF_LINK_STATE][0] + 4)
            vf["link_state"] = LINK_STATES.get(state, str(state))
        if VF_RATE in a:
            _, lo, hi = struct.unpack_from("=III", buf, a[VF_RATE][0])
            vf["min_tx_rate"], vf["max_tx_rate"] = lo, hi
        vfs.append(vf)
    return vfs


class Link:
    """One RTNETLINK socket asking for one link by name."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        self.seq = 0

    def get(self, name: str) -> tuple[int, list[dict[str, object]]] | None:
        """(IFLA_NUM_VF, VF list) of the link called name; None if there is none."""
        self.seq += 1
        raw = name.encode() + b"\0"
        ifname = struct.pack("=HH", 4 + len(raw), IFLA_IFNAME) + raw + b"\0" * (-len(raw) % 4)
        mask = struct.pack("=HHI", 8, IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)
        body = struct.pack("=BBHiII", socket.AF_UNSPEC, 0, 0, 0, 0, 0) + ifname + mask
        head = struct.pack("=IHHII", 16 + len(body), RTM_GETLINK, NLM_F_REQUEST, self.seq, 0)
        self.sock.send(head + body)
        buf = self.sock.recv(1 << 20)
        _, mtype = struct.unpack_from("=IH", buf, 0)
        if mtype != RTM_NEWLINK:
            return None
        a = attrs(buf, 32, len(buf))
        num = struct.unpack_from("=I", buf, a[IFLA_NUM_VF][0])[0] if IFLA_NUM_VF in a else 0
        return num, (vf_list(buf, *a[IFLA_VFINFO_LIST]) if IFLA_VFINFO_LIST in a else [])


def mismatch(want: dict[int, dict[str, object]], vfs: list[dict[str, object]]) -> str | None:
    """The first declared value the kernel does not show yet, or None."""
    for index, values in want.items():
        if index >= len(vfs):
            return f"vf {index} absent"
        got = vfs[index]
        for key, value in values.items():
            if got.get(key) != value:
                return f"vf {index} {key}: {got.get(key)!r} != {value!r}"
    return None


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out_path = sys.argv[2]
    net_dir = f"/sys/bus/pci/devices/{spec['pci']}/net" if spec.get("pci") else None
    fixed_name = spec.get("netdev")
    numvfs = int(spec["numvfs"])
    want = {int(i): v for i, v in spec.get("vfs", {}).items()}
    rxe = f"/sys/class/infiniband/{spec['rxe']}" if spec.get("rxe") else None
    interval = float(spec.get("interval", 0.002))
    link = Link()
    res: dict[str, object] = {"t_pf": None, "t_vfs": None, "t_done": None, "last": None}
    start = time.monotonic()
    deadline = start + float(spec["timeout"])
    res["t_start"] = start
    polls = 0
    busy = 0.0
    ready = spec.get("ready")
    # wait_gone: the PF is there now and about to go (a driver reload): wait for it
    # to vanish first, then time its return.
    gone = not spec.get("wait_gone")
    while True:
        t = time.monotonic()
        polls += 1
        name = fixed_name
        if net_dir is not None:
            try:
                names = os.listdir(net_dir)
            except OSError:
                names = []
            name = names[0] if names else None
        if not gone:
            gone = name is None
            name = None
        got = link.get(name) if name else None
        if got is not None:
            if res["t_pf"] is None:
                res["t_pf"] = t
                res["pf_at_start"] = polls == 1
            num, vfs = got
            if res["t_vfs"] is None and num == numvfs and len(vfs) == numvfs:
                res["t_vfs"] = t
            if res["t_vfs"] is not None:
                why = mismatch(want, vfs)
                if why is None and rxe is not None and not os.path.exists(rxe):
                    why = f"{rxe} absent"
                res["last"] = why
                if why is None:
                    res["t_done"] = t
        busy += time.monotonic() - t
        if ready and polls == 1:
            with open(ready, "w"):
                pass
        if res["t_done"] is not None or t > deadline:
            break
        time.sleep(interval)
    res["polls"] = polls
    res["poll_s"] = busy / polls
    with open(out_path + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(out_path + ".tmp", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

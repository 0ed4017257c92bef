"""What each config key means, in words for the config reference.

docs/CONFIG-REFERENCE.md is generated from the schema (``rdmad.model.desired``) by
``python -m rdmad.configref``, which takes each key's type and default from the schema
and its meaning from here; a key without a meaning here, or a meaning of a key the
schema does not have, stops the generator (and tests/unit/test_configref.py fails).
"""

from __future__ import annotations

# The meaning of every table, by its header ("[daemon]", "[[sriov.vf]]"), and of every
# key, by its path without indexes ("daemon.settle", "sriov.vf.mac", "rxe.netdev.pci").
DESCRIPTIONS: dict[str, str] = {
    # [daemon]
    "[daemon]": (
        "How the daemon runs. Each key that is valid on its own is used at start even "
        "when the config as a whole is invalid: logging and the state directory are "
        "chosen before the rest is read. A reload applies `drift_interval`, `settle` and "
        "`startup_timeout`; a changed `log_format`, `log_level` or `state_dir` needs a "
        "restart, and the reload says so (status note, history, journal)."
    ),
    "daemon.drift_interval": (
        "How often a pass runs without any event, to catch what no event reports; "
        "events do the work."
    ),
    "daemon.settle": (
        "Kernel events that arrive during a pass or within this window after it are "
        "answered by one pass."
    ),
    "daemon.startup_timeout": (
        "READY=1 is sent at the latest this long after start, converged or not."
    ),
    "daemon.log_format": (
        "`auto`: `console` on a terminal, `logfmt` otherwise (the journal). "
        "`rdmad run --log-format` overrides it."
    ),
    "daemon.log_level": (
        "The least level logged. `rdmad run --log-level` overrides it (then a config that "
        "changes it is said to have no effect, also after a restart)."
    ),
    "daemon.state_dir": (
        "Where `state.json` (state and history) and `rxe-claims.json` are kept; an "
        "absolute path. Left at the default, systemd's `StateDirectory=` is used when the "
        "unit sets it."
    ),
    # [api]
    "[api]": (
        "The local UNIX-socket API that `rdmad-ctl` talks to ([API.md](API.md)). Read "
        "once, at start; an invalid config elsewhere does not take it away. A reload that "
        "changes it says that it needs a restart (status note, history, journal)."
    ),
    "api.socket": (
        "The socket's path: absolute, at most 107 bytes (a UNIX socket's limit); made "
        "root:`read_group`, mode 0660, before it listens."
    ),
    "api.read_group": (
        "Members may read status, plan, history, config and metrics (root always may). "
        "A group that does not exist leaves the socket root-only. A number is a gid as it "
        "is (rdmad in a container: the socket's group must be the host's)."
    ),
    "api.write_group": (
        "Members may also reload and reconcile. Unset: root only. A name or a gid, as `read_group`."
    ),
    "api.enabled": "`false` turns the API off.",
    # [metrics]
    "[metrics]": (
        "Prometheus metrics ([METRICS.md](METRICS.md)): always served on the API socket "
        "at `/metrics`; these keys add a node_exporter textfile and a TCP listener, both "
        "off by default. Read at start: a change needs a restart, and a reload that "
        "changes them says so (status note, history, journal)."
    ),
    "metrics.textfile_dir": (
        "A node_exporter textfile collector directory (an absolute path): `rdmad.prom` is "
        "written there atomically. Unset: no textfile."
    ),
    "metrics.listen": (
        "`host:port` of a TCP listener that serves `GET /metrics` only. Loopback "
        "addresses only (`127.0.0.1`, `[::1]`, `localhost`): it has no authentication. "
        "Unset: no listener. The packaged unit needs the drop-in "
        "`/usr/share/rdmad/metrics-tcp.conf` for it."
    ),
    "metrics.textfile_interval": (
        "How often the textfile is rewritten; also soon after each status change, at "
        "most once a second."
    ),
    # [[rxe]]
    "[[rxe]]": (
        "One Soft-RoCE (rxe) link each. A later file's `[[rxe]]` with the same `name` "
        "is the same link: it overrides the keys it sets. One rxe link per netdev."
    ),
    "rxe.name": "The RDMA link's name, e.g. `rxe0`.",
    "rxe.netdev": (
        "The netdev the link runs on: an inline table with exactly one of `name`, "
        "`mac`, `pci`. A name follows the name (after a rename the link moves to the "
        "netdev that carries it); a MAC or PCI address follows the device."
    ),
    "rxe.netdev.name": "The netdev by its name.",
    "rxe.netdev.mac": "The netdev by its permanent or current MAC address.",
    "rxe.netdev.pci": "The netdev of this PCI function.",
    # [[sriov]]
    "[[sriov]]": (
        "SR-IOV physical functions (PFs): one named by `pf`, or every PF a `select` "
        "matches on this node (one file for a fleet). A later file's `[[sriov]]` with the "
        "same `pf` reference, or the same `select` table, is the same declaration: it "
        "overrides the keys it sets. A PF follows one declaration: a literal `pf` wins "
        "over a selector for the PF it names; a PF two selectors match is blocked, naming "
        "both."
    ),
    "sriov.pf": (
        "The PF: an inline table with exactly one of `name`, `mac`, `pci` (a PCI "
        "address is stable across renames). A reference that matches several PFs (a "
        "MAC shared by two ports) is blocked; one that matches none waits for it. "
        "Exactly one of `pf` and `select`."
    ),
    "sriov.pf.name": "The PF by its netdev's name.",
    "sriov.pf.mac": "The PF by its netdev's permanent or current MAC address.",
    "sriov.pf.pci": "The PF by its PCI address.",
    "sriov.select": (
        "Every SR-IOV PF that matches each key given (an array: any of its values), as "
        "the sriov-network-operator's `nicSelector` and systemd-networkd's `.link` "
        "`[Match]` choose devices. Each PF it matches is an object of its own, named by "
        "its PCI address (`sriov pci=0000:3b:00.0`); matching none on a node is "
        "converged there, with a note."
    ),
    "sriov.select.vendor": (
        "PCI vendor ID (`lspci -n`, sysfs `vendor`): `15b3` Mellanox/NVIDIA, `8086` "
        "Intel, `14e4` Broadcom."
    ),
    "sriov.select.device": "PCI device ID (`lspci -n`, sysfs `device`), e.g. `1017` ConnectX-5.",
    "sriov.select.driver": (
        "The PF's bound driver (`mlx5_core`, `ice`, `igb`); a PF with no driver bound "
        "does not match it."
    ),
    "sriov.select.pci_path": (
        "The PF's PCI address (`0000:3b:*`: every function on bus 3b); a netdevsim "
        "device's name (`netdevsim*`)."
    ),
    "sriov.select.name": (
        "The PF's netdev name (`ens1f*`); a PF without a netdev (its driver unloaded) "
        "does not match it."
    ),
    "sriov.numvfs": (
        "How many VFs the PF has. A non-zero count changes only through 0, and only "
        "while no VF is in use."
    ),
    "sriov.driver_guard": (
        "Refuse `modprobe -r` of the PF's driver while its VFs are in use (a hook rdmad "
        "keeps in `/etc/modprobe.d/rdmad-guard.conf`; [GUARD.md](GUARD.md)); where "
        "MOFED/DOCA's `openibd.service` exists, its stop asks the guard first too (a "
        "runtime drop-in made from the unit's own `ExecStop=`). On by default for a "
        "declared PF: nothing is guarded where no PF (and no rxe link) is declared."
    ),
    "sriov.in_use_drift": (
        "A VF in use whose settings drifted from the declaration: `report` says so and "
        "leaves it alone; `apply` rewrites it anyway (on several drivers that resets "
        "the VF under its user). A `[[sriov.vf]]` may set its own."
    ),
    "sriov.owner": (
        "Unset: while another network manager declares SR-IOV for this PF (a systemd "
        "`.link` with `SR-IOVVirtualFunctions=` or `[SR-IOV]`, a `.network` with "
        "`[SR-IOV]`, a NetworkManager profile with `[sriov]`, the SR-IOV network "
        "operator's config daemon), rdmad writes nothing to the PF or its VFs: the object "
        "is blocked, naming the manager and its file (a file rdmad cannot read, or one "
        'that may apply to the PF, holds it too). `"rdmad"`: rdmad manages it anyway '
        "(status notes that it overrides the other manager; stop that one from writing "
        "it, or the two undo each other)."
    ),
    "sriov.vf": "The declared VFs of this PF: one `[[sriov.vf]]` per VF or per range of VFs.",
    # [[sriov.vf]]
    "[[sriov.vf]]": (
        'One VF (`index = 3`), a range of VFs (`index = "0-7"`) or the VFs no range '
        'names (`index = "rest"`) of the `[[sriov]]` above it, as the '
        'sriov-network-operator\'s `pfNames: ["ens1f0#0-7"]` groups them. An attribute '
        "left out is never touched. A VF's own block overrides the keys its range sets, "
        "a range the keys `rest` sets. A later file's `[[sriov.vf]]` with the same "
        "`index` under the same PF is the same block: it overrides the keys it sets."
    ),
    "sriov.vf.index": (
        'The VF\'s number, below `numvfs`, once per PF; or a range (`"8-15"`, ranges do '
        'not overlap), or `"rest"`.'
    ),
    "sriov.vf.mac": (
        'The VF\'s MAC address; or derived on the node: `{ derive = "pf-mac" }` from the '
        "PF's permanent MAC and the VF index (follows the card), `{ derive = "
        '"machine-id" }` from /etc/machine-id, the PF\'s address and the VF index (as '
        "networkd's `MACAddressPolicy=persistent`). A derived MAC is the first 6 bytes "
        "of the SHA-256 of `rdmad-vf-mac pf-mac=<mac> vf=<index>` (or `rdmad-vf-mac "
        "machine-id=<id> pf=<pci> vf=<index>`) with the first byte's low bits `10`: "
        "unicast, locally administered, the same after a reboot or a re-install; two "
        "VFs of the node that would get one are both refused. A range's MAC is derived."
    ),
    "sriov.vf.vlan": "The VF's VLAN ID (0: none).",
    "sriov.vf.qos": "The VLAN priority; needs `vlan`.",
    "sriov.vf.vlan_proto": (
        "The VLAN protocol; needs `vlan`. Unset: a `vlan` is sent as 802.1Q (as `ip link "
        "set ... vlan V` does), and a VF reading another protocol is moved to it."
    ),
    "sriov.vf.spoofchk": "Spoof checking of the VF's source MAC and VLAN.",
    "sriov.vf.trust": (
        "Trust: a trusted VF may change its own MAC and use promiscuous or all-multicast mode."
    ),
    "sriov.vf.link_state": ("`auto`: the VF's link follows the PF's; `enable`, `disable`: forced."),
    "sriov.vf.min_tx_rate": (
        "Minimum transmit rate, Mbit/s; not above `max_tx_rate` unless that is 0."
    ),
    "sriov.vf.max_tx_rate": "Maximum transmit rate, Mbit/s; 0: unlimited.",
    "sriov.vf.query_rss": "May the VF query the PF's RSS configuration.",
    "sriov.vf.driver": (
        "The kernel driver the VF is bound to (e.g. `vfio-pci` for passthrough), "
        'changed only while the VF is free; `"none"` keeps it unbound (through '
        "`driver_override`), for tools that bind it themselves."
    ),
    "sriov.vf.in_use_drift": "This VF's own `in_use_drift`. Unset: the PF's.",
    "sriov.autoprobe": (
        "`sriov_drivers_autoprobe`: `false` leaves the VFs the PF creates unbound until "
        "rdmad binds each one's declared `driver` (no host driver takes a VF meant for "
        "vfio-pci first); written before the VFs are created. Unset: left as it is "
        "(the kernel's default, `true`, after a reboot)."
    ),
    "sriov.eswitch": (
        "The PF's eSwitch (`devlink dev eswitch set`; ConnectX, BlueField, E810 and the "
        "like; the driver resets it at every boot and reload): an inline table with "
        "`mode` and, where the driver has them, `inline_mode` and `encap_mode`. Set "
        "before the VFs are made; a mode change while VFs exist (it re-creates their "
        "vports) waits until none is in use. Unset: left as it is."
    ),
    "sriov.eswitch.mode": "`legacy` or `switchdev` (VF representors; OVS offload, SR-IOV CNI).",
    "sriov.eswitch.inline_mode": (
        "`none`, `link`, `network` or `transport`: the headers the VF's traffic carries "
        "to the eSwitch inline. Unset: the driver's."
    ),
    "sriov.eswitch.encap_mode": "`none` or `basic` (tunnel offload). Unset: the driver's.",
    "sriov.vf.node_guid": (
        "InfiniBand VFs only: the node GUID; set by re-binding the VF, so only while it is free."
    ),
    "sriov.vf.port_guid": (
        "InfiniBand VFs only: the port GUID; set by re-binding the VF, so only while it is free."
    ),
    "sriov.vf.policy": (
        "InfiniBand VFs only: the link policy; on a VF in use, as `in_use_drift` says."
    ),
    # [peermem]
    "[peermem]": (
        "GPUDirect peer memory: the peer-memory module for the running kernel "
        "(`nvidia-peermem`, else `nvidia-p2p`) loaded when `nvidia` and `ib_core` both "
        "are; never unloaded. Not declared: rdmad leaves it alone. A GPU node that wants "
        'it loaded declares so: `mode = "auto"` under `[peermem]`.'
    ),
    "peermem.mode": (
        "`auto`: load it; while it cannot be, the object is blocked (converged, with a "
        "note, when DMA-BUF works without it). `require`: load it; degraded while it is "
        "not loaded. `off` (the default): never load it, and say nothing about it."
    ),
    # [rdma]
    "[rdma]": "The RDMA subsystem, node-wide.",
    "rdma.netns_mode": (
        "`rdma system set netns`: `exclusive` shows an RDMA device only in the network "
        "namespace it was moved into (containers with RDMA need it), `shared` in every "
        "namespace (the kernel's default). Written as an ib_core option in "
        "/etc/modprobe.d/rdmad-ib-core.conf (ib_core starts in it at boot and after a "
        "reload) and set in the running kernel, which allows it only while no network "
        "namespace but the host's exists (blocked, naming them, otherwise). Unset: left "
        "as it is."
    ),
}

"""What the config pages say beyond the schema: worked examples of whole setups, and what
rdmad does not do (so an operator does not look for a key that cannot exist).

Written once here and shown twice, as rdmad.toml(5)'s EXAMPLES and WHAT RDMAD DOES NOT
DO (``rdmad.manpages``) and at the end of docs/CONFIG-REFERENCE.md (``rdmad.configref``).
Each example is a real node's config file as it stands, and the tests run every block of
both pages through ``rdmad check-config``: an example the schema refuses fails the build
of the docs, not an operator who copied it.

A tool for the docs: nothing in the daemon imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    title: str
    text: str  # why the setup is written this way: one paragraph, Markdown-ish
    toml: str  # a whole config file, as /etc/rdmad/rdmad.d/NAME.toml would hold it


EXAMPLES: tuple[Example, ...] = (
    Example(
        "ConnectX VFs with VLANs for virtual machines",
        "Eight VFs on port 0 of a ConnectX card, each handed to a KVM guest through "
        "`vfio-pci`. `autoprobe = false` keeps the host's `mlx5_core` from binding a VF "
        "before rdmad binds it to `vfio-pci`; each tenant's VF gets a fixed MAC and its "
        "VLAN, and may not spoof either. A VF a running guest holds is never rebound or "
        "rewritten: drift on it is reported (`rdmad-ctl status`). Declare the other VFs "
        "the same way; an index not declared is made but never configured.",
        """\
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 8
autoprobe = false

[[sriov.vf]]
index = 0
mac = "02:3b:00:00:00:00"
vlan = 100
qos = 3
spoofchk = true
trust = false
link_state = "auto"
driver = "vfio-pci"

[[sriov.vf]]
index = 1
mac = "02:3b:00:00:00:01"
vlan = 200
spoofchk = true
trust = false
link_state = "auto"
max_tx_rate = 10000
driver = "vfio-pci"
""",
    ),
    Example(
        "One file for a fleet",
        "The same file on every node (Ansible, a DaemonSet's ConfigMap, an image): "
        "every ConnectX-5/6 PF (vendor `15b3`, device `1017` or `101b`) gets 16 VFs, "
        'split into groups as the sriov-network-operator\'s `pfNames: ["ens1f0#0-7"]` '
        "does: VFs 0-7 for VMs (`vfio-pci`, VLAN 100), 8-15 for pods; VF 0 has a block of "
        "its own that overrides its range's VLAN. Every Intel E810 PF (driver `ice`) "
        "gets 8 VFs. Each MAC is derived on the node (unique, locally administered, the "
        "same after a reboot or a re-install), so one file gives every VF of every node "
        "its own. A node without a card of a kind has nothing to do for it (converged, "
        "status says no PF matches); each PF a selector matches is named by its PCI "
        "address in status (`sriov pci=0000:3b:00.0`), and `rdmad plan` shows each "
        "derived MAC as the address it is.",
        """\
[[sriov]]
select = { vendor = "15b3", device = ["1017", "101b"] }
numvfs = 16
autoprobe = false

[[sriov.vf]]
index = "0-7"
mac = { derive = "pf-mac" }
vlan = 100
spoofchk = true
driver = "vfio-pci"

[[sriov.vf]]
index = "8-15"
mac = { derive = "pf-mac" }
trust = true

[[sriov.vf]]
index = 0
vlan = 101

[[sriov]]
select = { driver = "ice" }
numvfs = 8

[[sriov.vf]]
index = "rest"
mac = { derive = "machine-id" }
spoofchk = true
""",
    ),
    Example(
        "Soft-RoCE on a second NIC",
        "A node without RDMA hardware speaks RoCEv2 over the second port of its NIC: "
        "`rxe0` on the netdev of PCI function `0000:01:00.1`, found by its address so a "
        "rename does not move the link. The netdev's IP address (RoCEv2's GID comes "
        "from it) and MTU are set by the network configuration, not by rdmad: without "
        "an address the link exists but cannot serve, and `rdmad-ctl status` says so.",
        """\
[[rxe]]
name = "rxe0"
netdev = { pci = "0000:01:00.1" }
""",
    ),
    Example(
        "A GPU node with GPUDirect RDMA",
        "A GPU node whose jobs run in containers: the peer-memory module "
        "(`nvidia-peermem`) is loaded whenever both the GPU driver and the RDMA core are, "
        "at boot, after a driver reload and after an RDMA stack restart, and never "
        'unloaded. `mode = "auto"` is written out, not left to the default; '
        '`"require"` instead makes the node degraded while the module is not loaded. '
        'The RDMA netns mode `"exclusive"` lets a container see only the RDMA devices '
        "moved into its network namespace. No SR-IOV is declared: the ConnectX PFs "
        "serve the host.",
        """\
[peermem]
mode = "auto"

[rdma]
netns_mode = "exclusive"
""",
    ),
    Example(
        "InfiniBand VFs with fixed GUIDs",
        "Four VFs on a ConnectX InfiniBand port, two of them with node and port GUIDs "
        "the subnet manager's partition config names, so a VM keeps its partition "
        "membership across reboots. The GUIDs are set by rebinding the VF, so only while "
        "it is free; `policy` decides whether the VF's port follows the physical one. "
        "The PF is found by its netdev's name here; a PCI address is stable across "
        "renames.",
        """\
[[sriov]]
pf = { name = "ibp59s0" }
numvfs = 4

[[sriov.vf]]
index = 0
node_guid = "02:c9:03:00:00:3b:00:00"
port_guid = "02:c9:03:00:00:3b:00:01"
policy = "Follow"

[[sriov.vf]]
index = 1
node_guid = "02:c9:03:00:00:3b:01:00"
port_guid = "02:c9:03:00:00:3b:01:01"
policy = "Follow"
""",
    ),
)

# What an operator might look for in the config and will not find: each (subject, what
# to use instead). Every line here is a rule of the planner, not a gap to be filled.
NOT_DONE: tuple[tuple[str, str], ...] = (
    (
        "Firmware and BIOS limits",
        "The most VFs a PF can have (`sriov_totalvfs`) is set by the card's firmware "
        "(ConnectX: `mlxconfig ... set SRIOV_EN=1 NUM_OF_VFS=N` and a firmware reset), "
        "SR-IOV and the IOMMU by the BIOS and the kernel command line. rdmad writes "
        "neither: a `numvfs` above `sriov_totalvfs` is blocked, and status says so.",
    ),
    (
        "IP addresses, MTU, routes, bonds",
        "Of no netdev, PF, VF or rxe's: NetworkManager, systemd-networkd, netplan or "
        "ifupdown own them. An rxe link whose netdev has no address cannot serve "
        "(status says why); a VF's MTU is its user's.",
    ),
    (
        "The PF's own link",
        "Its MAC, VLAN, speed, MTU and up/down state are not managed. rdmad brings a PF "
        "up only where its driver makes VFs only while it is up (`bnxt_en`), right "
        "before making them and once udev has named its netdev (before Linux 6.2 an "
        "interface that is up cannot be renamed); it never takes one down.",
    ),
    (
        "What is not declared",
        "A PF, VF, attribute or rxe link the config does not name is never touched: an "
        "rxe link rdmad made in this boot and the config no longer declares is deleted "
        "(once unused), but removing an `[[sriov]]` leaves its VFs as they are (declare "
        "`numvfs = 0` first to remove them).",
    ),
    (
        "PFs a selector cannot see",
        "A selector matches what the kernel shows now: a PF whose driver is unbound "
        "matches no `driver` or `name` key until it is bound again (its PCI vendor and "
        "device always match), and a PF two selectors match is left alone until one "
        "declaration names it. At boot, a PF with no driver that udev has not processed "
        "yet (its driver may still be loaded) and that a selector could match once it "
        "has one waits as an object of its own, so the node does not read converged "
        "before coldplug reached it. Literal `pf` references keep waiting for their PF, "
        "as before.",
    ),
    (
        "Anything in use",
        "A VF a VM, process or container holds is not rebound, re-created or (unless "
        '`in_use_drift = "apply"`) rewritten; a module is loaded, never unloaded.',
    ),
)

"""What is declared: frozen msgspec Structs that are the config schema, so validation
(every error with its key path, ``rdmad.model.validation``) comes from the schema itself.

Build them from data with ``validate(Desired, data)``; a Struct built directly checks
only its ``__post_init__`` rules (the field checks are the validation's)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, field

from rdmad import pfselect
from rdmad.model.validation import After, Before, SpecError, validate
from rdmad.model.values import (
    AnyMac,
    Guid,
    IbPolicy,
    IfName,
    InUseDriftPolicy,
    LinkState,
    Pattern,
    PciAddress,
    PciId,
    RdmaName,
    UnicastMac,
    VlanProto,
    one_or_many,
    parse_duration,
    unicast_mac,
)
from rdmad.pathkeys import path_problem, socket_path_problem

# --- desired state (the config schema) ----------------------------------------------


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Immutable and hashable; keys are keywords, as in the config."""


def _one_of(model: _Spec, keys: tuple[str, ...], what: str) -> None:
    given = [k for k in keys if getattr(model, k) is not None]
    if len(given) != 1:
        raise ValueError(f"{what} needs exactly one of {', '.join(keys)}; got {len(given)}")


class NetdevRef(_Spec, frozen=True):
    """How to find a netdev: by name, permanent/current MAC, or PCI address."""

    name: IfName | None = None
    mac: AnyMac | None = None
    pci: PciAddress | None = None

    def __post_init__(self) -> None:
        _one_of(self, ("name", "mac", "pci"), "a netdev reference")

    def describe(self) -> str:
        if self.name is not None:
            return f"netdev {self.name}"
        if self.mac is not None:
            return f"netdev with MAC {self.mac}"
        return f"netdev of PCI {self.pci}"


class PfRef(NetdevRef, frozen=True):
    """How to find a physical function; same keys as a netdev reference."""

    def key(self) -> str:
        """Identity for merging drop-ins and naming the object in status."""
        if self.pci is not None:
            return f"pci={self.pci}"
        if self.name is not None:
            return f"name={self.name}"
        return f"mac={self.mac}"

    def describe(self) -> str:
        if self.pci is not None:
            return f"PF {self.pci}"
        if self.name is not None:
            return f"PF {self.name}"
        return f"PF with MAC {self.mac}"


# A selector key's values: one, or an array of them (any matches).
PciIds = Annotated[tuple[PciId, ...], Before(one_or_many)]
Patterns = Annotated[tuple[Pattern, ...], Before(one_or_many)]


class PfSelect(_Spec, frozen=True):
    """PFs chosen by what they are, not by name: every SR-IOV PF that matches each key
    given (a key's array: any of its values). One file then fits every node of a fleet;
    a node where nothing matches has nothing to do.

    The keys are those the sriov-network-operator's ``nicSelector`` and systemd-networkd's
    ``.link`` ``[Match]`` agree on for a PF: what the hardware is (PCI vendor and device
    ID), which driver runs it, where it sits (PCI address pattern), and its netdev name."""

    vendor: PciIds | None = None
    device: PciIds | None = None
    driver: Patterns | None = None
    pci_path: Patterns | None = None
    name: Patterns | None = None

    KEYS = pfselect.KEYS

    def __post_init__(self) -> None:
        if all(getattr(self, k) is None for k in self.KEYS):
            raise ValueError(f"a selector needs at least one of {', '.join(self.KEYS)}")

    def given(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(k, v) for k in self.KEYS if (v := getattr(self, k)) is not None]

    def selector(self) -> dict[str, tuple[str, ...]]:
        """The keys given, as ``rdmad.pfselect`` (shared with rdmad-ctl doctor) takes them."""
        return dict(self.given())

    def key(self) -> str:
        """'select:vendor=15b3,device=1017|1019': one word, for an object's name."""
        return pfselect.key(self.selector())

    def describe(self) -> str:
        """'vendor 15b3, device 1017 or 1019', for a message."""
        return pfselect.describe(self.selector())


class MacDerive(_Spec, frozen=True):
    """A MAC computed on the node (rdmad.reconcile.macs has the formula): locally
    administered, unicast, the same at every pass, reboot and re-install."""

    # "pf-mac": from the PF's permanent MAC and the VF index (follows the card);
    # "machine-id": from /etc/machine-id, the PF's address and the VF index (follows the
    # installation, as systemd-networkd's MACAddressPolicy=persistent).
    derive: Literal["pf-mac", "machine-id"]


def _mac_value(value: object) -> object:
    """A literal MAC (a string), or a table that says how to derive one."""
    if isinstance(value, str):
        return unicast_mac(value)
    if isinstance(value, dict):
        try:
            return validate(MacDerive, value)
        except SpecError as exc:
            raise ValueError(
                "; ".join(f"{'.'.join(map(str, loc)) or 'mac'}: {m}" for loc, m in exc.problems)
            ) from None
    if isinstance(value, MacDerive):
        return value
    raise ValueError(
        'expected a MAC ("02:00:00:00:00:01") or how to derive one '
        '({ derive = "pf-mac" } or { derive = "machine-id" })'
    )


REST = "rest"


def _vf_index(value: object) -> object:
    """A VF's index (3), a range of them ("0-7"), or "rest": the VFs no range names."""
    if isinstance(value, bool):
        raise ValueError(f"not a VF index: {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= 4095:
            raise ValueError(f"a VF index runs 0..4095, not {value}")
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == REST:
            return REST
        lo, sep, hi = text.partition("-")
        if sep and lo.strip().isdigit() and hi.strip().isdigit():
            first, last = int(lo), int(hi)
            if first <= last <= 4095:
                return f"{first}-{last}"
    raise ValueError(f'want a VF index (3), a range ("0-7") or "rest", not {value!r}')


def vf_range(index: int | str) -> range | None:
    """The VFs a range ("0-7") covers; None for one VF (3) or for "rest", whose VFs
    depend on the other blocks and numvfs (rdmad.reconcile.resolve)."""
    if isinstance(index, int) or index == REST:
        return None
    lo, _, hi = index.partition("-")
    return range(int(lo), int(hi) + 1)


VfIndex = Annotated[int | str, Before(_vf_index)]
VfMac = Annotated[str | MacDerive, Before(_mac_value)]


class _VfAttrs(_Spec, frozen=True, kw_only=True):
    """A VF's settings; an attribute left out is never touched. ``index`` and ``mac`` are
    here for their place (first, as a reader looks for them); each kind narrows them."""

    index: VfIndex
    mac: VfMac | None = None
    vlan: Annotated[int, Meta(ge=0, le=4094)] | None = None
    qos: Annotated[int, Meta(ge=0, le=7)] | None = None
    vlan_proto: VlanProto | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: LinkState | None = None
    min_tx_rate: Annotated[int, Meta(ge=0)] | None = None
    max_tx_rate: Annotated[int, Meta(ge=0)] | None = None
    query_rss: bool | None = None
    # A kernel driver name, or "none" to keep the VF unbound.
    driver: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    in_use_drift: InUseDriftPolicy | None = None  # None: the PF's setting
    node_guid: Guid | None = None
    port_guid: Guid | None = None
    policy: IbPolicy | None = None

    def __post_init__(self) -> None:
        if (self.qos is not None or self.vlan_proto is not None) and self.vlan is None:
            raise ValueError("qos and vlan_proto need vlan to be set as well")
        if (
            self.min_tx_rate is not None
            and self.max_tx_rate is not None
            and self.max_tx_rate != 0
            and self.min_tx_rate > self.max_tx_rate
        ):
            raise ValueError(
                f"min_tx_rate {self.min_tx_rate} is above max_tx_rate {self.max_tx_rate}"
            )


class VfSpec(_VfAttrs, frozen=True, kw_only=True):
    """One VF's settings as the planner applies them: one index, a literal MAC. A
    ``[[sriov.vf]]`` block (``VfBlock``) becomes these once its range and derived MAC
    are known on the node (rdmad.reconcile.resolve)."""

    index: Annotated[int, Meta(ge=0, le=4095)]
    mac: UnicastMac | None = None


class VfBlock(_VfAttrs, frozen=True, kw_only=True):
    """One ``[[sriov.vf]]``: a VF (``index = 3``), a range of them (``index = "0-7"``) or
    the VFs no range names (``index = "rest"``). A VF's own block overrides its range's
    keys; a range's keys override the rest's."""

    index: VfIndex
    mac: VfMac | None = None

    def __post_init__(self) -> None:
        _VfAttrs.__post_init__(self)
        if isinstance(self.index, int):
            return
        if isinstance(self.mac, str):
            raise ValueError(
                f"VFs {self.index} would all get MAC {self.mac}: a MAC for several VFs is "
                'derived (mac = { derive = "pf-mac" } or { derive = "machine-id" })'
            )
        if self.node_guid is not None or self.port_guid is not None:
            raise ValueError(
                f"VFs {self.index} would all get one GUID: node_guid and port_guid are "
                "declared per VF"
            )


class EswitchSpec(_Spec, frozen=True):
    """A PF's eSwitch (`devlink dev eswitch set`), set before its VFs are made. An option
    left out is left as the driver has it."""

    mode: Literal["legacy", "switchdev"]
    inline_mode: Literal["none", "link", "network", "transport"] | None = None
    encap_mode: Literal["none", "basic"] | None = None


# An [[sriov]] without a PF: said at its `pf` key, with the other errors (rdmad.config).
NO_PF = (
    "required key is missing (or select = { ... }: the PFs that match, e.g. "
    'select = { vendor = "15b3" })'
)


class SriovSpec(_Spec, frozen=True, kw_only=True):
    # Which PF: one named (pf), or every PF a selector matches (select).
    pf: PfRef | None = None
    select: PfSelect | None = None
    numvfs: Annotated[int, Meta(ge=0, le=4096)]
    driver_guard: bool = True
    # sriov_drivers_autoprobe: False leaves new VFs unbound until their declared driver
    # is bound; None: left as it is.
    autoprobe: bool | None = None
    eswitch: EswitchSpec | None = None  # None: not managed
    in_use_drift: InUseDriftPolicy = "report"
    # None: while another network manager declares SR-IOV for this PF (a systemd .link
    # or .network, a NetworkManager profile, the SR-IOV operator), rdmad writes nothing to
    # it and says so, rather than fight over it. "rdmad": rdmad manages it anyway.
    owner: Literal["rdmad"] | None = None
    vf: tuple[VfBlock, ...] = ()

    def __post_init__(self) -> None:
        if self.pf is None and self.select is None:
            raise ValueError(NO_PF)
        if self.pf is not None and self.select is not None:
            raise ValueError(
                "pf and select are two ways to name PFs: a [[sriov]] has one of them "
                "(a literal pf beside a selector is a [[sriov]] of its own, and wins)"
            )
        seen: set[int | str] = set()
        spans: list[tuple[range, str]] = []
        problems = []
        for v in self.vf:
            what = f"VF index {v.index}" if isinstance(v.index, int) else f"VFs {v.index!r}"
            if v.index in seen:
                problems.append(f"{what} is declared twice")
            seen.add(v.index)
            span = vf_range(v.index)
            last = v.index if isinstance(v.index, int) else None if span is None else span[-1]
            if last is not None and last >= self.numvfs:
                verb = "does not exist" if isinstance(v.index, int) else "run past the last VF"
                problems.append(
                    f"{what} {verb} with numvfs = {self.numvfs} (indexes run 0..{self.numvfs - 1})"
                )
            if span is not None:
                for other, name in spans:
                    if set(span) & set(other):
                        problems.append(
                            f"VFs {v.index!r} overlap VFs {name!r}: a VF is in one range "
                            "(its own [[sriov.vf]] block overrides its range)"
                        )
                spans.append((span, str(v.index)))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def obj(self) -> str:
        """The object's name: the PF reference's, or (a selector matching nothing on
        this node) the selector's. A PF a selector matches is named by its PCI address."""
        if self.pf is not None:
            return f"sriov {self.pf.key()}"
        assert self.select is not None
        return f"sriov {self.select.key()}"


class RxeSpec(_Spec, frozen=True):
    name: RdmaName
    netdev: NetdevRef

    @property
    def obj(self) -> str:
        return f"rxe {self.name}"


class PeermemSpec(_Spec, frozen=True):
    # "off" unless declared: a config that declares nothing changes nothing, on a GPU
    # node too. A GPU node that wants nvidia-peermem loaded says so (mode = "auto").
    mode: Literal["auto", "require", "off"] = "off"


class RdmaSpec(_Spec, frozen=True):
    """The RDMA subsystem, node-wide."""

    # `rdma system set netns`: "exclusive" gives each network namespace the RDMA devices
    # moved into it and no others (containers with RDMA need it), "shared" shows every
    # device in every namespace (the kernel's default). None: not managed.
    netns_mode: Literal["shared", "exclusive"] | None = None


def _path(value: str) -> str:
    problem = path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _socket_path(value: str) -> str:
    problem = socket_path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A path the daemon writes or binds: absolute (rdmad.pathkeys says why).
AbsolutePath = Annotated[str, After(_path)]


class DaemonSpec(_Spec, frozen=True):
    drift_interval: Annotated[float, Meta(ge=1.0), Before(parse_duration)] = 300.0
    settle: Annotated[float, Meta(le=10.0), Before(parse_duration)] = 0.15
    startup_timeout: Annotated[float, Meta(gt=0.0), Before(parse_duration)] = 30.0
    log_format: Literal["auto", "json", "logfmt", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    state_dir: AbsolutePath = "/var/lib/rdmad"


# A Unix group name, or a gid by number: in a container the image's /etc/group is not
# the host's, and the socket's group must be the host's.
_GROUP = r"^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$"


class ApiSpec(_Spec, frozen=True):
    """The local UNIX-socket API (docs/API.md)."""

    socket: Annotated[str, After(_socket_path)] = "/run/rdmad/rdmad.sock"
    # Members may read status, plan, history, config, metrics (root always may).
    read_group: Annotated[str, Meta(pattern=_GROUP)] = "rdmad"
    # Members may also reload and reconcile; None: root only.
    write_group: Annotated[str, Meta(pattern=_GROUP)] | None = None
    enabled: bool = True


_HOST_PORT = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$"  # 127.0.0.1:9478, [::1]:9478


def _loopback_only(value: str) -> str:
    """The metrics listener serves anyone who can connect, without authentication: it
    may listen on loopback only (a scraper on the node, or a port forward)."""
    host = value.rpartition(":")[0].removeprefix("[").removesuffix("]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"the metrics listener binds to a loopback address only (127.0.0.1, [::1], "
            f"localhost), not {host!r}; scrape from the node or through a port forward, "
            "or use textfile_dir"
        )
    return value


class MetricsSpec(_Spec, frozen=True):
    """Prometheus metrics: always on the API socket at /metrics; optionally also here."""

    # A node_exporter textfile collector directory: rdmad.prom is written there atomically.
    textfile_dir: AbsolutePath | None = None
    # host:port of a TCP listener ("127.0.0.1:9478"), loopback only; None (the default):
    # no TCP listener.
    listen: Annotated[str, Meta(pattern=_HOST_PORT), After(_loopback_only)] | None = None
    textfile_interval: Annotated[float, Meta(ge=1.0), Before(parse_duration)] = 15.0


class Desired(_Spec, frozen=True):
    daemon: DaemonSpec = field(default_factory=DaemonSpec)
    api: ApiSpec = field(default_factory=ApiSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    rxe: tuple[RxeSpec, ...] = ()
    sriov: tuple[SriovSpec, ...] = ()
    peermem: PeermemSpec = field(default_factory=PeermemSpec)
    rdma: RdmaSpec = field(default_factory=RdmaSpec)

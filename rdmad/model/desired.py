"""What is declared: frozen msgspec Structs that are the config schema, so validation
(every error with its key path, ``rdmad.model.validation``) comes from the schema itself.

Build them from data with ``validate(Desired, data)``; a Struct built directly checks
only its ``__post_init__`` rules (the field checks are the validation's)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, field

from rdmad.model.validation import After, Before
from rdmad.model.values import (
    AnyMac,
    Guid,
    IbPolicy,
    IfName,
    InUseDriftPolicy,
    LinkState,
    PciAddress,
    RdmaName,
    UnicastMac,
    VlanProto,
    parse_duration,
)

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


class VfSpec(_Spec, frozen=True):
    """Declared settings of one VF; an attribute left out is never touched."""

    index: Annotated[int, Meta(ge=0, le=4095)]
    mac: UnicastMac | None = None
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


class EswitchSpec(_Spec, frozen=True):
    """A PF's eSwitch (`devlink dev eswitch set`), set before its VFs are made. An option
    left out is left as the driver has it."""

    mode: Literal["legacy", "switchdev"]
    inline_mode: Literal["none", "link", "network", "transport"] | None = None
    encap_mode: Literal["none", "basic"] | None = None


class SriovSpec(_Spec, frozen=True):
    pf: PfRef
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
    vf: tuple[VfSpec, ...] = ()

    def __post_init__(self) -> None:
        seen: set[int] = set()
        problems = []
        for v in self.vf:
            if v.index in seen:
                problems.append(f"VF index {v.index} is declared twice")
            seen.add(v.index)
            if v.index >= self.numvfs:
                problems.append(
                    f"VF index {v.index} does not exist with numvfs = {self.numvfs} "
                    f"(indexes run 0..{self.numvfs - 1})"
                )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def obj(self) -> str:
        return f"sriov {self.pf.key()}"


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


class DaemonSpec(_Spec, frozen=True):
    drift_interval: Annotated[float, Meta(ge=1.0), Before(parse_duration)] = 300.0
    settle: Annotated[float, Meta(le=10.0), Before(parse_duration)] = 0.15
    startup_timeout: Annotated[float, Meta(gt=0.0), Before(parse_duration)] = 30.0
    log_format: Literal["auto", "json", "logfmt", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    state_dir: str = "/var/lib/rdmad"


# A Unix group name, or a gid by number: in a container the image's /etc/group is not
# the host's, and the socket's group must be the host's.
_GROUP = r"^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$"


class ApiSpec(_Spec, frozen=True):
    """The local UNIX-socket API (docs/API.md)."""

    socket: str = "/run/rdmad/rdmad.sock"
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
    textfile_dir: str | None = None
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

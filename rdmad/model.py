"""The data rdmad reasons about: what is declared, what the kernel shows, what to do.

Three families, all immutable:

* ``Desired`` and its parts are pydantic models: they are the config schema, so
  validation (with every error and its key path) comes from the schema itself.
* ``Observed`` and its parts are frozen dataclasses: plain snapshots filled by
  ``rdmad.kernel`` and read by ``rdmad.reconcile``; cheap to build by the hundred.
* ``Action`` subclasses are frozen dataclasses: one kernel change each, with the
  object it belongs to and a reason a human can read. ``Blocked`` and ``Waiting``
  are actions that change nothing; they carry why an object is not converged.

Nothing here does I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# --- value types -----------------------------------------------------------------

_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_GUID_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){7}$")
_PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_IFNAME_RE = re.compile(r"^[^/\s:]{1,15}$")


def _unicast_mac(value: str) -> str:
    mac = value.strip().lower()
    if not _MAC_RE.match(mac):
        raise ValueError(f"not a MAC address (want xx:xx:xx:xx:xx:xx): {value!r}")
    if mac == "00:00:00:00:00:00":
        raise ValueError(f"the all-zero MAC cannot be assigned: {value!r}")
    if int(mac[:2], 16) & 1:
        raise ValueError(f"not a unicast MAC (multicast bit set): {value!r}")
    return mac


def _any_mac(value: str) -> str:
    mac = value.strip().lower()
    if not _MAC_RE.match(mac):
        raise ValueError(f"not a MAC address (want xx:xx:xx:xx:xx:xx): {value!r}")
    return mac


def _guid(value: str) -> str:
    guid = value.strip().lower()
    if not _GUID_RE.match(guid):
        raise ValueError(f"not a GUID (want 8 bytes as xx:xx:xx:xx:xx:xx:xx:xx): {value!r}")
    return guid


def _pci(value: str) -> str:
    addr = value.strip().lower()
    if re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", addr):
        addr = "0000:" + addr  # the short form lspci prints
    if not _PCI_RE.match(addr):
        raise ValueError(f"not a PCI address (want DDDD:BB:DD.F): {value!r}")
    return addr


def _ifname(value: str) -> str:
    if not _IFNAME_RE.match(value) or value in (".", ".."):
        raise ValueError(
            f"not a network interface name (1-15 chars, no '/', ':' or space): {value!r}"
        )
    return value


UnicastMac = Annotated[str, AfterValidator(_unicast_mac)]
AnyMac = Annotated[str, AfterValidator(_any_mac)]
Guid = Annotated[str, AfterValidator(_guid)]
PciAddress = Annotated[str, AfterValidator(_pci)]
IfName = Annotated[str, AfterValidator(_ifname)]
RdmaName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,63}$")]
ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,55}$")]

VlanProto = Literal["802.1Q", "802.1ad"]
LinkState = Literal["auto", "enable", "disable"]
IbPolicy = Literal["Follow", "Up", "Down"]
# What to do when a VF that is in use has drifted from its declared settings:
# "report" (default) says so and leaves it alone, "apply" rewrites it anyway.
# Rewriting MAC/VLAN/trust under a VM resets the VF on several drivers (i40e, ice)
# and fights libvirt, so applying is an explicit opt-in.
InUseDriftPolicy = Literal["report", "apply"]
# VfSpec.driver value meaning "no driver": the VF stays unbound (e.g. for passthrough
# tools that bind it themselves); kept so through driver_override.
NO_DRIVER = "none"

# Seconds as a float, written in config as "150ms", "5m", "2s" or a bare number.
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> float:
    """'150ms' -> 0.15; numbers are seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f"not a duration (e.g. '150ms', '5m', '30s'): {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


# --- desired state (the config schema) ----------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)


def _one_of(model: BaseModel, keys: tuple[str, ...], what: str) -> None:
    given = [k for k in keys if getattr(model, k) is not None]
    if len(given) != 1:
        raise ValueError(f"{what} needs exactly one of {', '.join(keys)}; got {len(given)}")


class NetdevRef(_Spec):
    """How to find a netdev: by name, permanent/current MAC, or PCI address."""

    name: IfName | None = None
    mac: AnyMac | None = None
    pci: PciAddress | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> NetdevRef:
        _one_of(self, ("name", "mac", "pci"), "a netdev reference")
        return self

    def describe(self) -> str:
        if self.name is not None:
            return f"netdev {self.name}"
        if self.mac is not None:
            return f"netdev with MAC {self.mac}"
        return f"netdev of PCI {self.pci}"


class PfRef(NetdevRef):
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


class VfSpec(_Spec):
    """Declared settings of one VF; an attribute left out is never touched."""

    index: int = Field(ge=0, le=4095)
    mac: UnicastMac | None = None
    vlan: int | None = Field(default=None, ge=0, le=4094)
    qos: int | None = Field(default=None, ge=0, le=7)
    vlan_proto: VlanProto | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: LinkState | None = None
    min_tx_rate: int | None = Field(default=None, ge=0)
    max_tx_rate: int | None = Field(default=None, ge=0)
    query_rss: bool | None = None
    # A kernel driver name, or "none" to keep the VF unbound.
    driver: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    in_use_drift: InUseDriftPolicy | None = None  # None: the PF's setting
    node_guid: Guid | None = None
    port_guid: Guid | None = None
    policy: IbPolicy | None = None

    @model_validator(mode="after")
    def _coherent(self) -> VfSpec:
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
        return self


class SriovSpec(_Spec):
    pf: PfRef
    numvfs: int = Field(ge=0, le=4096)
    driver_guard: bool = True
    in_use_drift: InUseDriftPolicy = "report"
    vf: tuple[VfSpec, ...] = ()

    @model_validator(mode="after")
    def _vf_indexes(self) -> SriovSpec:
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
        return self

    @property
    def obj(self) -> str:
        return f"sriov {self.pf.key()}"


class RxeSpec(_Spec):
    name: RdmaName
    netdev: NetdevRef

    @property
    def obj(self) -> str:
        return f"rxe {self.name}"


class PeermemSpec(_Spec):
    mode: Literal["auto", "require", "off"] = "auto"


class DaemonSpec(_Spec):
    drift_interval: Annotated[float, Field(ge=1.0), BeforeValidator(parse_duration)] = 300.0
    settle: Annotated[float, Field(le=10.0), BeforeValidator(parse_duration)] = 0.15
    startup_timeout: Annotated[float, Field(gt=0.0), BeforeValidator(parse_duration)] = 30.0
    log_format: Literal["auto", "json", "logfmt", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    state_dir: str = "/var/lib/rdmad"


class Desired(_Spec):
    daemon: DaemonSpec = DaemonSpec()
    rxe: tuple[RxeSpec, ...] = ()
    sriov: tuple[SriovSpec, ...] = ()
    peermem: PeermemSpec = PeermemSpec()


# --- observed state (what the kernel shows) --------------------------------------------


class Use(enum.Enum):
    """Whether something is in use. UNKNOWN counts as in use everywhere."""

    FREE = "free"
    IN_USE = "in-use"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Usage:
    state: Use
    holders: tuple[str, ...] = ()  # e.g. "pid 1234 (qemu-system-x86) holds /dev/vfio/42"

    @property
    def busy(self) -> bool:
        return self.state is not Use.FREE

    def describe(self) -> str:
        if self.state is Use.FREE:
            return "free"
        if self.holders:
            return "; ".join(self.holders)
        return "owner unknown, treated as in use"


FREE = Usage(Use.FREE)


@dataclass(frozen=True, slots=True)
class VfSettings:
    """VF attributes as rtnetlink reports them on the PF (IFLA_VFINFO_LIST).

    ``None`` in a field means the kernel did not report that attribute.
    """

    mac: str | None = None
    vlan: int | None = None
    qos: int | None = None
    vlan_proto: str | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: str | None = None
    min_tx_rate: int | None = None
    max_tx_rate: int | None = None
    query_rss: bool | None = None


@dataclass(frozen=True, slots=True)
class IbVfSettings:
    """InfiniBand VF identity from /sys/class/infiniband/DEV/device/sriov/N/."""

    node_guid: str | None = None
    port_guid: str | None = None
    policy: str | None = None


@dataclass(frozen=True, slots=True)
class VfObserved:
    index: int
    pci: str | None  # None while the VF's PCI device has not appeared yet
    driver: str | None = None
    driver_override: str | None = None
    netdev: str | None = None
    settings: VfSettings | None = None  # None: not readable (see PfObserved.settings_note)
    ib: IbVfSettings | None = None  # None: not an InfiniBand PF
    usage: Usage = FREE


@dataclass(frozen=True, slots=True)
class PfObserved:
    pci: str
    driver: str | None
    netdev: str | None
    ifindex: int | None
    mac: str | None
    perm_mac: str | None
    numvfs: int
    totalvfs: int
    drivers_autoprobe: bool = True
    operstate_up: bool | None = None
    vfs: tuple[VfObserved, ...] = ()
    # Why VF settings are None, when they are (truncated list, netlink not read...).
    settings_note: str | None = None
    ib_device: str | None = None

    def vf(self, index: int) -> VfObserved | None:
        for v in self.vfs:
            if v.index == index:
                return v
        return None


@dataclass(frozen=True, slots=True)
class NetdevObserved:
    name: str
    ifindex: int
    mac: str | None = None
    perm_mac: str | None = None
    pci: str | None = None
    up: bool = False


@dataclass(frozen=True, slots=True)
class RdmaLinkObserved:
    """An RDMA device (port 1) and the netdev it is bound to."""

    name: str
    driver: str | None  # "rxe", "mlx5_core", ... (kernel driver of the ib device)
    netdev: str | None
    netdev_ifindex: int | None = None
    usage: Usage = FREE

    @property
    def is_rxe(self) -> bool:
        return self.driver == "rxe"


@dataclass(frozen=True, slots=True)
class ModulesObserved:
    loaded: frozenset[str] = frozenset()
    loading_disabled: bool = False  # /proc/sys/kernel/modules_disabled = 1


@dataclass(frozen=True, slots=True)
class Observed:
    netdevs: tuple[NetdevObserved, ...] = ()
    pfs: tuple[PfObserved, ...] = ()  # every SR-IOV capable PCI function
    rdma_links: tuple[RdmaLinkObserved, ...] = ()
    modules: ModulesObserved = field(default_factory=ModulesObserved)
    # False only when the kernel is known to have no NETLINK_RDMA: rxe can never work there.
    rdma_netlink: bool = True
    notes: tuple[str, ...] = ()  # what could not be read, in words

    def netdev(self, name: str) -> NetdevObserved | None:
        for n in self.netdevs:
            if n.name == name:
                return n
        return None

    def rdma_link(self, name: str) -> RdmaLinkObserved | None:
        for r in self.rdma_links:
            if r.name == name:
                return r
        return None


# --- state kept between passes ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanState:
    """What rdmad remembers that the kernel does not tell: what it created.

    Losing it is safe: rdmad then owns nothing and removes nothing.
    """

    managed_rxe: frozenset[str] = frozenset()
    # VF attributes a driver refused as unsupported, not retried until the config or
    # the PF's driver changes.
    unsupported: frozenset[UnsupportedKey] = frozenset()


@dataclass(frozen=True, slots=True, order=True)
class UnsupportedKey:
    """A VF attribute a PF driver refused (EOPNOTSUPP, EPROTONOSUPPORT, EINVAL)."""

    pci: str  # the PF
    driver: str  # the PF's driver when it refused
    vf: int
    attr: str
    value: str  # format_value() of what was refused: another value may work
    error: str = field(default="", compare=False)  # what the kernel said, for status


# --- actions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a plan. ``obj`` names the declared object, e.g. 'sriov 0000:3b:00.0'."""

    obj: str
    reason: str
    kind: ClassVar[str] = "action"
    changes_kernel: ClassVar[bool] = True

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class SetNumVfs(Action):
    pci: str = ""
    old: int = 0
    new: int = 0
    kind: ClassVar[str] = "set-numvfs"

    def describe(self) -> str:
        return f"{self.pci}: sriov_numvfs {self.old} -> {self.new}"


@dataclass(frozen=True, slots=True)
class SetLinkUp(Action):
    """Bring a PF netdev up: some drivers create VFs only while the PF is up."""

    netdev: str = ""
    kind: ClassVar[str] = "set-link-up"

    def describe(self) -> str:
        return f"ip link set {self.netdev} up"


@dataclass(frozen=True, slots=True)
class VfChange:
    vf: int
    attr: str  # a VfSettings field name
    old: object
    new: object


@dataclass(frozen=True, slots=True)
class SetVfSettings(Action):
    """Per-VF rtnetlink settings of one PF, meant to go out as one batched message."""

    pci: str = ""
    pf_netdev: str = ""
    pf_ifindex: int | None = None  # the PF is addressed by ifindex: names can change
    changes: tuple[VfChange, ...] = ()
    kind: ClassVar[str] = "set-vf"

    def describe(self) -> str:
        parts = [
            f"vf {c.vf} {c.attr} {format_value(c.old)} -> {format_value(c.new)}"
            for c in self.changes
        ]
        return f"{self.pf_netdev} ({self.pci}): " + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class SetIbVf(Action):
    """Write IB node/port GUID and policy; they take effect after the VF is re-bound."""

    pci: str = ""
    ib_device: str = ""
    vf: int = 0
    vf_pci: str = ""
    changes: tuple[VfChange, ...] = ()
    rebind: bool = False  # unbind + bind the VF so new GUIDs take effect
    vf_driver: str | None = None  # the VF's driver when planned (what the rebind unbinds)
    kind: ClassVar[str] = "set-ib-vf"

    def describe(self) -> str:
        parts = [f"{c.attr} {format_value(c.old)} -> {format_value(c.new)}" for c in self.changes]
        then = f", then rebind {self.vf_pci}" if self.rebind else ""
        return f"{self.ib_device} vf {self.vf}: " + ", ".join(parts) + then


@dataclass(frozen=True, slots=True)
class BindVfDriver(Action):
    """Bind a VF to ``new`` (or keep it unbound when ``new`` is NO_DRIVER) via driver_override."""

    vf_pci: str = ""
    old: str | None = None  # the VF's driver when planned
    new: str = ""
    override_old: str | None = None  # driver_override when planned
    load_module: bool = False  # the driver's module was not loaded when planned
    kind: ClassVar[str] = "bind-vf"

    def describe(self) -> str:
        return f"{self.vf_pci}: driver {format_value(self.old)} -> {self.new}"


@dataclass(frozen=True, slots=True)
class LoadModule(Action):
    module: str = ""
    kind: ClassVar[str] = "load-module"

    def describe(self) -> str:
        return f"modprobe {self.module}"


@dataclass(frozen=True, slots=True)
class AddRxe(Action):
    name: str = ""
    netdev: str = ""
    kind: ClassVar[str] = "add-rxe"

    def describe(self) -> str:
        return f"rdma link add {self.name} type rxe netdev {self.netdev}"


@dataclass(frozen=True, slots=True)
class DeleteRxe(Action):
    name: str = ""
    netdev: str | None = None  # where the link was when planned
    kind: ClassVar[str] = "delete-rxe"

    def describe(self) -> str:
        return f"rdma link delete {self.name}"


@dataclass(frozen=True, slots=True)
class Blocked(Action):
    """Something must not or cannot be done; says why and who holds it."""

    kind: ClassVar[str] = "blocked"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"blocked: {self.reason}"


@dataclass(frozen=True, slots=True)
class Waiting(Action):
    """Nothing to do yet: the kernel has not shown what the object needs."""

    kind: ClassVar[str] = "waiting"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"waiting: {self.reason}"


@dataclass(frozen=True, slots=True)
class _VfNote(Action):
    """A note about one VF attribute that leaves the rest of the object converged."""

    vf: int = 0
    attr: str = ""
    changes_kernel: ClassVar[bool] = False
    label: ClassVar[str] = ""

    def describe(self) -> str:
        return f"{self.label}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Unsupported(_VfNote):
    """A VF attribute the PF's driver refused: reported, not retried (see PlanState)."""

    kind: ClassVar[str] = "unsupported"
    label: ClassVar[str] = "unsupported"


@dataclass(frozen=True, slots=True)
class InUseDrift(_VfNote):
    """A VF in use differs from its declaration; left alone unless in_use_drift = "apply"."""

    kind: ClassVar[str] = "drift-in-use"
    label: ClassVar[str] = "drift on in-use VF"


def action_touches(action: Action) -> frozenset[str]:
    """Names an action depends on: netdev and RDMA names, PCI addresses, "ifindex:N".

    An event that renames or removes one of them makes the action stale (the agent
    re-observes before applying it); events about anything else leave it alone.
    """
    names: set[str | None] = set()
    if isinstance(action, SetNumVfs):
        names = {action.pci}
    elif isinstance(action, SetLinkUp):
        names = {action.netdev}
    elif isinstance(action, SetVfSettings):
        names = {action.pci, action.pf_netdev}
        if action.pf_ifindex is not None:
            names.add(f"ifindex:{action.pf_ifindex}")
    elif isinstance(action, SetIbVf):
        names = {action.pci, action.ib_device, action.vf_pci}
    elif isinstance(action, BindVfDriver):
        names = {action.vf_pci}
    elif isinstance(action, AddRxe | DeleteRxe):
        names = {action.name, action.netdev}
    return frozenset(n for n in names if n)


def format_value(value: object) -> str:
    """How a setting reads in plans and logs: None is 'unset', booleans are on/off."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# --- status ------------------------------------------------------------------------------


class ObjectState(enum.Enum):
    CONVERGED = "converged"
    PENDING = "pending"  # actions to apply, or waiting for the kernel
    BLOCKED = "blocked"  # would hurt something in use, or impossible as declared
    DEGRADED = "degraded"  # applying failed; retried with backoff
    UNSUPPORTED = "unsupported-by-driver"  # all else converged; the driver refuses an attribute
    DRIFT_IN_USE = "drift-on-in-use-vf"  # all else converged; a VF in use differs, left alone


@dataclass(frozen=True, slots=True)
class ObjectStatus:
    obj: str
    state: ObjectState
    message: str = ""


# Notes that leave an object otherwise converged, in the order they are reported.
_NOTE_STATES: tuple[tuple[type[Action], ObjectState], ...] = (
    (InUseDrift, ObjectState.DRIFT_IN_USE),
    (Unsupported, ObjectState.UNSUPPORTED),
)


def summarize(objects: list[str], actions: list[Action]) -> list[ObjectStatus]:
    """Per declared object: converged when the plan has nothing for it.

    Blocked beats pending (actions or waiting) beats the notes that leave an object
    otherwise converged (drift on an in-use VF, an attribute the driver refuses).
    """
    result = []
    for obj in objects:
        mine = [a for a in actions if a.obj == obj]
        if not mine:
            result.append(ObjectStatus(obj, ObjectState.CONVERGED))
            continue
        blocked = [a for a in mine if isinstance(a, Blocked)]
        notes = {t: [a for a in mine if isinstance(a, t)] for t, _ in _NOTE_STATES}
        active = [a for a in mine if not isinstance(a, Blocked | InUseDrift | Unsupported)]
        if blocked:
            result.append(ObjectStatus(obj, ObjectState.BLOCKED, blocked[0].reason))
        elif active:
            result.append(ObjectStatus(obj, ObjectState.PENDING, active[0].reason))
        else:
            for kind, state in _NOTE_STATES:
                if notes[kind]:
                    msg = "; ".join(a.reason for a in notes[kind])
                    result.append(ObjectStatus(obj, state, msg))
                    break
    return result

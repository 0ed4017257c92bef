"""The RDMA subsystem's network-namespace mode: what the kernel has now, and what
ib_core gets when it is next loaded.

Now: ``/sys/module/ib_core/parameters/netns_mode`` is the live setting (the module
parameter is the very variable `rdma system set netns` changes): ``Y`` shared, ``N``
exclusive; absent while ib_core is not loaded. rdmad changes it over RDMA netlink
(nldev SYS_SET, ``RdmaNetlink.set_netns_mode``), which the kernel allows only while no
network namespace but the initial one exists (EBUSY otherwise).

Next load: rdmad's modprobe.d file ``options ib_core netns_mode=0`` (exclusive) or
``=1`` (shared), so that ib_core comes up in the declared mode at boot and after an
RDMA stack reload, before any container or ``ip netns`` namespace can exist: that is
the moment the kernel accepts it without condition. The file is rdmad's like the guard
hook (``guardhook``): written atomically, removed when ``[rdma] netns_mode`` is no
longer declared. An ib_core loaded from the initramfs reads the initramfs's copy of
modprobe.d (``update-initramfs -u`` after the first write; the README says so).

The observation also names the namespaces that stand in the way, but only when a
change is pending (the file says a mode the kernel does not have): one stat per
process (``rdmad.netnsnames``, which the doctor shares).

Standard library only.
"""

from __future__ import annotations

import os
import re

from rdmad.fileio import write_or_remove
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.observed import RdmaSysObserved
from rdmad.netnsnames import NETNS_MODE_PARAM as PARAM
from rdmad.netnsnames import NETNS_MODES, other_namespaces

OPTIONS_FILE = "etc/modprobe.d/rdmad-ib-core.conf"
HEADER = (
    "# Written by rdmad from [rdma] netns_mode, removed when that is not declared. Do not\n"
    "# edit: ib_core starts in this RDMA network-namespace mode (0 exclusive, 1 shared).\n"
)
_OPTION = re.compile(r"^options\s+ib_core\s+netns_mode=([01YNyn])\s*$", re.M)


def render(mode: str) -> str:
    """The file for ``mode`` ("shared" or "exclusive")."""
    value = {"shared": 1, "exclusive": 0}[mode]
    return f"{HEADER}options ib_core netns_mode={value}\n"


def file_mode(text: str) -> str | None:
    """The mode a file's ``options`` line gives; None when it has none rdmad wrote."""
    m = _OPTION.search(text)
    return NETNS_MODES[m.group(1).upper()] if m else None


def observe_rdma_sys(sysfs: Sysfs, carry: RdmaSysObserved | None = None) -> RdmaSysObserved:
    """The mode now and at the next load; the namespaces while a change is pending.

    ``carry``: the last observation's, for a narrow look after link events (a Kubernetes
    node's pods make veth events by the hundred): while the same change is still
    pending, its namespaces are taken over instead of read again (one stat per
    process). A full observation (drift, module events) reads them afresh."""
    raw = sysfs.read(PARAM)
    live = NETNS_MODES.get(raw or "", None if raw is None else f"unknown ({raw})")
    text = sysfs.read(OPTIONS_FILE)
    boot = file_mode(text) if text is not None else None
    current = text is None or (boot is not None and text == render(boot).strip())  # read strips
    namespaces: tuple[str, ...] | None = None
    unknown: str | None = None
    pending = live is not None and boot is not None and live != boot
    if (
        pending
        and carry is not None
        and (carry.netns_mode, carry.boot_mode) == (live, boot)
        and (carry.namespaces is not None or carry.namespaces_unknown is not None)
    ):
        namespaces, unknown = carry.namespaces, carry.namespaces_unknown
    elif pending:
        try:
            seen = other_namespaces(sysfs)
            namespaces = seen.labels
            if seen.unreadable:
                unknown = f"the network namespace of {seen.unreadable} processes is not readable"
        except OSError as exc:
            unknown = f"cannot tell which network namespaces exist: {exc.strerror or exc}"
    return RdmaSysObserved(
        netns_mode=live,
        boot_mode=boot,
        boot_file=text is not None,
        boot_file_current=current,
        namespaces=namespaces,
        namespaces_unknown=unknown,
    )


def write_options(sysfs: Sysfs, mode: str | None) -> None:
    """Write the file for ``mode`` atomically; None: remove it."""
    path = sysfs.path(OPTIONS_FILE)
    if mode is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)  # kmod ships it; a bare root may not
    write_or_remove(path, render(mode).encode() if mode is not None else None)

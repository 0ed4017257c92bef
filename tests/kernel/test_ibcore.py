"""rdmad.kernel.ibcore and usage.namespaces: the RDMA netns mode now and at ib_core's
next load, and the network namespaces that stand in the way of a change (fake trees,
and this machine's own namespaces as root)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad.kernel.ibcore import OPTIONS_FILE, PARAM, observe_rdma_sys, render, write_options
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import RdmaSysObserved
from rdmad.netnsnames import other_namespaces
from tests.support.fakesysfs import FakeSysfs
from tests.support.netns import owned_netns, wait_entered


def namespaces_tree(root: Path) -> FakeSysfs:
    """rdmad and pid 100 in the host's namespace; pid 200 and 201 in 'blue' (ip netns);
    pid 300 in an unnamed one (a container)."""
    fs = FakeSysfs(root)
    fs.write("proc/self/ns/net", "")
    fs.write("proc/300/ns/net", "")
    fs.write("run/netns/blue", "")
    for pid, comm, same_as in (
        (100, "sshd", "proc/self/ns/net"),
        (200, "dnsmasq", "run/netns/blue"),
        (201, "sleep", "run/netns/blue"),
    ):
        (root / f"proc/{pid}/ns").mkdir(parents=True)
        os.link(root / same_as, root / f"proc/{pid}/ns/net")
        fs.write(f"proc/{pid}/comm", comm)
    fs.write("proc/300/comm", "pause")
    return fs


def test_live_mode_from_the_module_parameter(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    assert observe_rdma_sys(Sysfs(tmp_path)) == RdmaSysObserved()  # ib_core not loaded
    fs.module("ib_core", netns_mode="Y")
    assert observe_rdma_sys(Sysfs(tmp_path)).netns_mode == "shared"
    fs.write(PARAM, "N")
    assert observe_rdma_sys(Sysfs(tmp_path)).netns_mode == "exclusive"


def test_option_file_round_trip_and_a_hand_edit(tmp_path: Path) -> None:
    sysfs = Sysfs(tmp_path)
    (tmp_path / "etc/modprobe.d").mkdir(parents=True)
    write_options(sysfs, "exclusive")
    text = (tmp_path / OPTIONS_FILE).read_text()
    assert text.endswith("options ib_core netns_mode=0\n") and text == render("exclusive")
    seen = observe_rdma_sys(sysfs)
    assert (seen.boot_mode, seen.boot_file, seen.boot_file_current) == ("exclusive", True, True)
    (tmp_path / OPTIONS_FILE).write_text("options ib_core netns_mode=1\n")  # edited by hand
    seen = observe_rdma_sys(sysfs)
    assert (seen.boot_mode, seen.boot_file_current) == ("shared", False)
    (tmp_path / OPTIONS_FILE).write_text("# nothing of rdmad's\n")
    assert observe_rdma_sys(sysfs).boot_mode is None
    write_options(sysfs, None)
    write_options(sysfs, None)  # already gone: fine
    assert not (tmp_path / OPTIONS_FILE).exists()


def test_namespaces_are_read_only_while_a_change_is_pending(tmp_path: Path) -> None:
    fs = namespaces_tree(tmp_path)
    fs.module("ib_core", netns_mode="Y")
    sysfs = Sysfs(tmp_path)
    assert observe_rdma_sys(sysfs).namespaces is None  # no option file: nothing pending
    write_options(sysfs, "shared")
    assert observe_rdma_sys(sysfs).namespaces is None  # as the option says
    write_options(sysfs, "exclusive")
    seen = observe_rdma_sys(sysfs)
    assert seen.namespaces == (
        "'blue' (ip netns): pid 200 (dnsmasq), pid 201 (sleep)",
        "pid 300 (pause)",
    )
    assert seen.namespaces_unknown is None


def test_a_failed_listing_is_unknown_never_none(tmp_path: Path) -> None:
    """Said as unknown (the plan then lets the kernel decide, which it does atomically)."""
    fs = FakeSysfs(tmp_path)
    fs.module("ib_core", netns_mode="Y")
    write_options(Sysfs(tmp_path), "exclusive")
    # no proc/self/ns/net and no /proc listing: cannot tell
    seen = observe_rdma_sys(Sysfs(tmp_path))
    assert seen.namespaces is None and seen.namespaces_unknown is not None
    with pytest.raises(OSError):
        other_namespaces(Sysfs(tmp_path))


def test_a_process_that_exits_meanwhile_is_skipped(tmp_path: Path) -> None:
    namespaces_tree(tmp_path)
    (tmp_path / "proc/400").mkdir()  # listed, but its ns/net is gone
    assert len(other_namespaces(Sysfs(tmp_path)).labels) == 2


def test_an_unreadable_namespace_is_counted_not_guessed(tmp_path: Path) -> None:
    namespaces_tree(tmp_path)
    (tmp_path / "proc/500/ns").mkdir(parents=True)
    (tmp_path / "proc/500/ns/net").symlink_to("net")  # a loop: ELOOP, as EACCES would
    seen = other_namespaces(Sysfs(tmp_path))
    assert (len(seen.labels), seen.unreadable) == (2, 1)


@pytest.fixture
def named_namespace() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (the kernel suite runs as root)")
    with owned_netns() as ns:
        holder = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
        try:
            yield ns, holder
        finally:
            holder.kill()
            holder.wait()


def test_real_namespaces_are_named(named_namespace: tuple[str, subprocess.Popen[bytes]]) -> None:
    ns, holder = named_namespace
    wait_entered(holder.pid, ns)
    labels = other_namespaces(Sysfs("/")).labels
    ours = [label for label in labels if label.startswith(f"{ns!r} (ip netns)")]
    assert ours == [f"{ns!r} (ip netns): pid {holder.pid} (sleep)"], labels
    # The test's own namespace (the host's, here) is never listed.
    assert not any(f"pid {os.getpid()} " in label for label in labels)


def test_a_narrow_look_carries_the_namespaces_of_the_same_pending_change(tmp_path: Path) -> None:
    fs = namespaces_tree(tmp_path)
    fs.module("ib_core", netns_mode="Y")
    sysfs = Sysfs(tmp_path)
    write_options(sysfs, "exclusive")
    full = observe_rdma_sys(sysfs)
    assert full.namespaces is not None and len(full.namespaces) == 2
    (tmp_path / "proc/300/ns/net").unlink()  # a container gone: only a full look sees it
    (tmp_path / "proc/300/comm").unlink()
    assert observe_rdma_sys(sysfs, full).namespaces == full.namespaces
    assert len(observe_rdma_sys(sysfs).namespaces or ()) == 1
    fs.write(PARAM, "N")  # the change happened: nothing pending, nothing carried
    assert observe_rdma_sys(sysfs, full).namespaces is None

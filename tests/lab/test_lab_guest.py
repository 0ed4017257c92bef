"""The lab itself: command execution, rdmad installation, reboot semantics, guests
started from the saved boot."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import tomllib
from harness import (
    PACKAGE_PYTHON,
    REPO_ROOT,
    SAVED_BOOT_ENV,
    VENV,
    Guest,
    GuestPool,
    GuestTimeout,
    install_mode,
    rewrite_exec_start,
)
from packaging.requirements import Requirement

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


def test_guest_exec_returns_rc_stdout_stderr(guest: Guest) -> None:
    res = guest.run("echo out; echo err >&2; exit 7")
    assert (res.rc, res.out, res.err) == (7, "out\n", "err\n")
    assert guest.run("cat", stdin=b"via stdin").out == "via stdin"


def test_guest_exec_timeout_is_bounded(guest: Guest) -> None:
    # Unbounded, `sleep 30` would end with rc 0: the raise is the proof of the bound.
    with pytest.raises(GuestTimeout):
        guest.run("sleep 30", timeout=2)
    assert guest.run("true").ok  # the agent is still usable


def _repo_version() -> str:
    text = (REPO_ROOT / "rdmad" / "__init__.py").read_text()
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    assert match, "rdmad/__init__.py has no __version__"
    return match.group(1)


# The image's Python (Debian 12): the runtime dependencies its venv must hold are those
# whose markers hold there (tomli and async-timeout are for Python 3.10 only).
GUEST_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.2"}


def _runtime_dists() -> list[str]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        deps = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    return [d.name for d in deps if d.marker is None or d.marker.evaluate(GUEST_PYTHON)]


def test_install_rdmad_puts_the_package_in_place(guest: Guest) -> None:
    report = guest.install_rdmad()

    assert report.compiled, report.output
    if install_mode() == "package":
        _assert_package_installed(guest)
        return
    out = guest.check(
        f"{VENV}/bin/python -c 'import rdmad; print(rdmad.__version__, rdmad.__file__)'"
    ).split()
    assert out[0] == _repo_version()
    assert out[1] == "/opt/rdmad/src/rdmad/__init__.py"
    assert guest.run("ls /opt/rdmad/src/rdmad/__pycache__/__init__.cpython-311.pyc").ok
    for tool, module in (("rdmad", "rdmad.cli"), ("rdmad-ctl", "rdmad.ctl")):
        wrapper = guest.check(f"test -x /usr/local/bin/{tool} && cat /usr/local/bin/{tool}")
        assert f'{VENV}/bin/python -m {module} "$@"' in wrapper


def _assert_package_installed(guest: Guest) -> None:
    """The .deb's rdmad: its own venv, /usr/bin commands, the unit installed but stopped."""
    out = guest.check(
        f"{PACKAGE_PYTHON} -c 'import rdmad; print(rdmad.__version__, rdmad.__file__)'"
    ).split()
    assert out[0] == _repo_version()
    assert out[1] == "/usr/lib/rdmad/lib/python3.11/site-packages/rdmad/__init__.py"
    assert guest.check("for t in rdmad rdmad-ctl; do command -v $t; done").split() == [
        "/usr/bin/rdmad",
        "/usr/bin/rdmad-ctl",
    ]
    assert guest.check("dpkg-query -W -f '${Status}' rdmad") == "install ok installed"
    # install_rdmad() leaves the service to each test: installed, stopped, disabled.
    assert guest.run("systemctl is-active rdmad.service").out.strip() == "inactive"
    assert guest.check("systemctl show -p FragmentPath --value rdmad.service").strip() == (
        "/lib/systemd/system/rdmad.service"
    )


def test_image_venv_holds_rdmad_runtime_dependencies(guest: Guest) -> None:
    dists = _runtime_dists()
    script = "import importlib.metadata as m, sys; [print(d, m.version(d)) for d in sys.argv[1:]]"
    out = guest.check(f"{VENV}/bin/python -c '{script}' {' '.join(dists)}")
    assert len(out.splitlines()) == len(dists)


@pytest.mark.lab_needs("boot", "reboot")
def test_reboot_keeps_disk_writes_but_loses_kernel_state(fresh_guest: Guest) -> None:
    g = fresh_guest
    first = g.boot_info
    assert first is not None
    token = g.check("cat /proc/sys/kernel/random/uuid").strip()
    g.check(f"mkdir -p /var/lib/lab-test && echo {token} > /var/lib/lab-test/token && sync")
    pf = g.igb_pf()
    assert g.set_numvfs(pf, 2).ok
    g.wait_vf_netdevs(pf, 2)
    g.check(
        "ip link add labv0 type veth peer name labv1 && rdma link add rxe0 type rxe netdev labv0"
    )

    second = g.reboot()

    assert second.boot_id != first.boot_id
    assert second.number == first.number + 1
    # snapshot=on keeps guest disk writes for the life of this QEMU process...
    assert g.read("/var/lib/lab-test/token") == token
    # ...but nothing restores kernel state: that is rdmad's job.
    pf = g.igb_pf()
    assert g.numvfs(pf) == 0
    assert g.vf_bdfs(pf) == []
    assert g.rdma_links() == []


def _age_of(g: Guest) -> tuple[float, float]:
    """(the guest kernel's uptime, its QEMU process's age), in s."""
    assert g.proc is not None
    uptime = float(g.read("/proc/uptime").split()[0])
    stat = Path(f"/proc/{g.proc.pid}/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # starttime, in clock ticks after boot
    host_uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime, host_uptime - ticks / os.sysconf("SC_CLK_TCK")


def test_guests_from_the_saved_boot_are_each_their_own_and_on_the_hosts_time(
    lab_pool: GuestPool,
) -> None:
    """Two fresh guests in a row: each started from the pool's saved boot (a kernel that
    has run longer than its QEMU process), on the host's clock, with a disk and a kernel
    of its own (the first one's file and VFs are not in the second)."""
    saved = lab_pool.saved_boot()
    assert saved is not None, f"no saved boot ({SAVED_BOOT_ENV}=0, or saving failed: see the log)"
    try:
        first = lab_pool.fresh()
        uptime, qemu_age = _age_of(first)
        assert uptime > qemu_age, (uptime, qemu_age)
        assert first.boot_info is not None and first.boot_info.boot_id == saved.boot.boot_id
        assert first.read("/proc/sys/kernel/random/boot_id") == saved.boot.boot_id
        assert abs(float(first.check("date +%s.%N")) - time.time()) < 30
        first.check("echo first > /root/only-in-the-first && sync")
        pf = first.igb_pf()
        assert first.set_numvfs(pf, 2).ok
        first.wait_vf_netdevs(pf, 2)

        second = lab_pool.fresh()  # the first one is stopped and its overlay dropped
        assert not first.alive()
        uptime, qemu_age = _age_of(second)
        assert uptime > qemu_age, (uptime, qemu_age)
        assert not second.exists("/root/only-in-the-first")
        assert second.numvfs(second.igb_pf()) == 0
        assert abs(float(second.check("date +%s.%N")) - time.time()) < 30
    finally:
        lab_pool.release_fresh()


@pytest.mark.parametrize(
    ("exec_start", "expected"),
    [
        (
            "ExecStart=/usr/bin/rdmad --config /etc/rdmad/rdmad.toml",
            "ExecStart=/usr/local/bin/rdmad --config /etc/rdmad/rdmad.toml",
        ),
        ("ExecStart=/usr/bin/python3 -m rdmad.cli run", "ExecStart=/usr/local/bin/rdmad run"),
        ("ExecStart=/usr/local/bin/rdmad", "ExecStart=/usr/local/bin/rdmad"),
        ("ExecStartPre=/usr/bin/true", "ExecStartPre=/usr/bin/true"),
    ],
)
def test_rewrite_exec_start_points_the_unit_at_the_wrapper(exec_start: str, expected: str) -> None:
    # Pure host-side check of install_rdmad()'s unit rewriting: needs no guest.
    unit = f"[Service]\nType=notify\n{exec_start}\n"
    assert rewrite_exec_start(unit) == f"[Service]\nType=notify\n{expected}\n"

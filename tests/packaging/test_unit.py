"""systemd/rdmad.service and its metrics drop-in: verify, and the hardening settings
the issue asks for (the lab proves they still let rdmad work)."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO, need

UNIT = REPO / "systemd" / "rdmad.service"
DROPIN = REPO / "systemd" / "metrics-tcp.conf"


def _service(text: str) -> dict[str, list[str]]:
    """[Service] settings, every assignment of a key kept in order, read as systemd reads
    them: spaces around the key and the value do not count, `;` starts a comment too."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_unit_reader_reads_keys_as_systemd_does() -> None:
    # `IPAddressDeny = any` is a setting to systemd: the forbidden-directive check below
    # must see it (it did not, when the key kept its spaces).
    s = _service("[Service]\nIPAddressDeny = any\n  Nice=-5\n; MemoryMax=1G\n")
    assert s == {"IPAddressDeny": ["any"], "Nice": ["-5"]}


def test_unit_is_hardened_as_declared() -> None:
    s = _service(UNIT.read_text())
    assert s["ProtectSystem"] == ["strict"]
    assert s["ProtectKernelTunables"] == ["yes"]
    # /run/systemd/system: openibd.service's runtime drop-in, only while a guard is declared.
    assert s["ReadWritePaths"] == [
        "/sys/devices /sys/bus/pci -/etc/modprobe.d -/run/systemd/system"
    ]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_NETLINK"]
    assert s["SystemCallFilter"] == ["@system-service @module", "~@resources"]
    assert s["MemoryDenyWriteExecute"] == ["yes"]
    assert s["RuntimeDirectoryMode"] == ["0755"]  # the API group must reach the socket
    assert s["Nice"] == ["-5"]  # ahead of busier processes on an event, never real-time
    assert s["RestrictRealtime"] == ["yes"]
    assert s["StateDirectory"] == ["rdmad"] and s["RuntimeDirectory"] == ["rdmad"]
    assert "ProtectKernelModules" not in s  # loading modules is part of its job
    # A reload checks the config before the daemon hears of it: a bad one fails the reload.
    assert s["ExecReload"] == ["/usr/bin/rdmad check-config", "/bin/kill -HUP $MAINPID"]


# Directives that reach kernel objects rdmad creates (cgroup filters apply to the
# sockets of the rxe devices it registers and of modules its modprobe initialises;
# VFs its writes probe are charged to its memory cgroup). Each broke, or would break,
# what rdmad restores: tests/lab/test_rdma_cm_lab.py, packaging/README.md.
FORBIDDEN = (
    "IPAddressDeny",
    "IPAddressAllow",
    "IPIngressFilterPath",
    "IPEgressFilterPath",
    "SocketBindDeny",
    "SocketBindAllow",
    "RestrictNetworkInterfaces",
    "PrivateNetwork",
    "NetworkNamespacePath",
    "MemoryMax",
    "MemoryHigh",
    "ProtectKernelLogs",
)


@pytest.mark.parametrize("path", [UNIT, DROPIN], ids=lambda p: p.name)
def test_no_directive_that_reaches_what_rdmad_creates(path: Path) -> None:
    s = _service(path.read_text())
    assert [k for k in FORBIDDEN if k in s] == []


def test_the_kernel_log_is_readable_in_the_sandbox() -> None:
    """PrivateDevices= hides /dev/kmsg: it is bound back read-only, allowed by the
    device policy, and CAP_SYSLOG reads it under dmesg_restrict (peermem findings)."""
    s = _service(UNIT.read_text())
    assert s["PrivateDevices"] == ["yes"]
    assert s["BindReadOnlyPaths"] == ["/dev/kmsg"]
    assert s["DeviceAllow"] == ["/dev/kmsg r"]
    assert "CAP_SYSLOG" in s["CapabilityBoundingSet"][0].split()


def test_every_capability_has_its_reason() -> None:
    text = UNIT.read_text()
    caps = _service(text)["CapabilityBoundingSet"][0].split()
    assert "CAP_SYS_ADMIN" not in caps
    for cap in caps:
        assert re.search(rf"^#\s+{cap}\s+\S", text, re.M), f"no comment says why {cap}"


def test_metrics_dropin_only_adds_inet() -> None:
    parser = configparser.ConfigParser(strict=False)
    parser.read_string(DROPIN.read_text())
    assert dict(parser["Service"]) == {"restrictaddressfamilies": "AF_INET AF_INET6"}


@pytest.mark.parametrize("with_dropin", [False, True])
def test_systemd_analyze_verify_prints_nothing(tmp_path: Path, with_dropin: bool) -> None:
    """The unit as shipped; only rdmad's program in ExecStart= and ExecReload= (not
    installed here) is pointed at an executable that exists, since verify checks that it
    does."""
    need("systemd-analyze")
    unit = tmp_path / "rdmad.service"
    unit.write_text(UNIT.read_text().replace("=/usr/bin/rdmad ", "=/bin/true "))
    if with_dropin:
        dropins = tmp_path / "rdmad.service.d"
        dropins.mkdir()
        (dropins / "metrics-tcp.conf").write_text(DROPIN.read_text())
    # --man=no: Documentation='s man pages are the package's (test_deb checks they are
    # in it); this host has the unit file only.
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


WAIT_UNIT = REPO / "systemd" / "rdmad-wait-converged.service"


def test_the_wait_unit_runs_rdmad_ctl_wait_after_rdmad_and_is_pulled_in_only_by_consumers() -> None:
    text = WAIT_UNIT.read_text()
    s = _service(text)
    assert s["Type"] == ["oneshot"] and s["RemainAfterExit"] == ["yes"]
    assert s["ExecStart"] == ["/usr/bin/rdmad-ctl wait --within ${RDMAD_WAIT_WITHIN}"]
    assert s["Environment"] == ["RDMAD_WAIT_WITHIN=120"]
    unit = [ln.strip() for ln in text.split("[Service]")[0].splitlines()]
    assert "Requires=rdmad.service" in unit and "After=rdmad.service" in unit
    # Not part of the boot by itself, and no tie to network-online.target (README.md).
    assert "[Install]" not in text
    assert not [ln for ln in unit if not ln.startswith("#") and "network-online" in ln]


def test_systemd_analyze_verify_of_the_wait_unit_prints_nothing(tmp_path: Path) -> None:
    need("systemd-analyze")
    (tmp_path / "rdmad.service").write_text(
        UNIT.read_text().replace("=/usr/bin/rdmad ", "=/bin/true ")
    )
    wait_unit = tmp_path / WAIT_UNIT.name
    wait_unit.write_text(WAIT_UNIT.read_text().replace("=/usr/bin/rdmad-ctl ", "=/bin/true "))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(wait_unit), str(tmp_path / "rdmad.service")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")

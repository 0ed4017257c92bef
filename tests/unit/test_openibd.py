"""openibd.service's stop as its files say it, and rdmad's drop-in made from it: the
drop-in runs the guard's check, then exactly what the unit runs, never a fixed command."""

from __future__ import annotations

import os
from pathlib import Path

from rdmad.doctor.fs import Root
from rdmad.openibd import DROPIN, dropin_runs, exec_stop_values, read_unit_stop, render_dropin

GUARD = "/usr/lib/rdmad/bin/python3 -I -m rdmad.guard"
MOFED_UNIT = """\
[Unit]
Description=openibd - configure Mellanox devices
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/etc/init.d/openibd start bootid=%b
ExecStop=/etc/init.d/openibd stop
[Install]
WantedBy=sysinit.target
"""


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_unit_file_systemd_loads_and_its_drop_ins_in_name_order(tmp_path: Path) -> None:
    put(tmp_path, "lib/systemd/system/openibd.service", MOFED_UNIT)
    # An admin's override resets ExecStop= and runs two commands, one spread over lines.
    put(
        tmp_path,
        "etc/systemd/system/openibd.service.d/20-site.conf",
        "[Service]\nExecStop=\nExecStop=-/usr/sbin/site-pre-stop --quiet\n"
        "ExecStop=/usr/sbin/openibd-stop \\\n  --all\n",
    )
    put(tmp_path, "etc/systemd/system/openibd.service.d/10-env.conf", "[Unit]\nExecStop=/no\n")
    # Ours (any directory, an older package's too) is never read as the unit's.
    put(
        tmp_path,
        "lib/systemd/system/openibd.service.d/rdmad-guard.conf",
        "[Service]\nExecStop=/x\n",
    )
    put(tmp_path, DROPIN, "[Service]\nExecStop=\nExecStop=/y\n")
    stop = read_unit_stop(Root(str(tmp_path)))
    assert stop.found and stop.why == ""
    assert stop.commands is not None
    assert [c.split() for c in stop.commands] == [
        ["-/usr/sbin/site-pre-stop", "--quiet"],
        ["/usr/sbin/openibd-stop", "--all"],  # the continuation joined, as systemd does
    ]
    assert stop.files == (
        "/lib/systemd/system/openibd.service",
        "/etc/systemd/system/openibd.service.d/10-env.conf",
        "/etc/systemd/system/openibd.service.d/20-site.conf",
    )


def test_a_higher_priority_unit_file_wins_and_a_sysv_script_counts(tmp_path: Path) -> None:
    put(
        tmp_path,
        "run/systemd/generator.late/openibd.service",
        "[Service]\nExecStop=/etc/init.d/openibd stop\n",
    )
    assert read_unit_stop(Root(str(tmp_path))).commands == ("/etc/init.d/openibd stop",)
    put(tmp_path, "etc/systemd/system/openibd.service", "[Service]\nExecStop=/opt/doca/stop\n")
    assert read_unit_stop(Root(str(tmp_path))).commands == ("/opt/doca/stop",)


def test_no_unit_a_masked_one_or_an_unreadable_file(tmp_path: Path) -> None:
    assert not read_unit_stop(Root(str(tmp_path))).found
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    os.symlink("/dev/null", tmp_path / "etc/systemd/system/openibd.service")
    assert not read_unit_stop(Root(str(tmp_path))).found
    os.unlink(tmp_path / "etc/systemd/system/openibd.service")
    put(tmp_path, "lib/systemd/system/openibd.service", MOFED_UNIT)
    (tmp_path / "lib/systemd/system/openibd.service.d").mkdir()
    os.symlink("nowhere", tmp_path / "lib/systemd/system/openibd.service.d/50-x.conf")
    stop = read_unit_stop(Root(str(tmp_path)))
    assert stop.found and stop.commands is None
    assert stop.why == "/lib/systemd/system/openibd.service.d/50-x.conf could not be read"


def test_the_drop_in_checks_first_then_runs_what_the_unit_runs(tmp_path: Path) -> None:
    put(
        tmp_path,
        "lib/systemd/system/openibd.service",
        MOFED_UNIT.replace(
            "ExecStop=/etc/init.d/openibd stop", "ExecStop=/usr/libexec/openibd/stop --force"
        ),
    )
    text = render_dropin(read_unit_stop(Root(str(tmp_path))), GUARD)
    values = exec_stop_values(text)
    assert values[0] == ""  # the unit's own list is reset...
    assert "rdmad.guard stack-stop --by openibd.service" in values[1]  # ...the check first
    assert values[2:] == ["/usr/libexec/openibd/stop --force"]  # then the unit's, as is
    assert "/etc/init.d/openibd" not in text
    assert dropin_runs(text) == ("/usr/libexec/openibd/stop --force",)
    # A guard that is gone (the package removed under the file) lets the stop go ahead.
    assert "[ -e /usr/lib/rdmad/bin/python3 ] || exit 0" in values[1]
    assert "ExecStopPost=/bin/sh -c '[ -e /usr/lib/rdmad/bin/python3 ] || exit 0; exec " in text

"""Driving rdmad as the systemd service in a lab guest: config, (re)start, status, log, history."""

from __future__ import annotations

import json
from typing import Any

from harness import Guest

STATE = "/var/lib/rdmad/state.json"


def write_config(g: Guest, text: str) -> None:
    g.check("mkdir -p /etc/rdmad && cat > /etc/rdmad/rdmad.toml", stdin=text.encode())


def start(g: Guest, text: str) -> None:
    """Write the config and (re)start rdmad; Type=notify returns after READY=1."""
    write_config(g, text)
    g.check("systemctl restart rdmad.service", timeout=300)


def reload(g: Guest, text: str) -> None:
    write_config(g, text)
    g.check("systemctl reload rdmad.service")


def stop_and_forget(g: Guest) -> None:
    """Stop rdmad and remove its config and state, so the next test starts from nothing."""
    g.run(
        "systemctl stop rdmad.service; systemctl reset-failed rdmad.service; "
        "rm -rf /etc/rdmad /var/lib/rdmad",
        timeout=360,
    )


def status_text(g: Guest) -> str:
    """The one-line status rdmad sends with sd_notify STATUS=."""
    return g.check("systemctl show -p StatusText --value rdmad.service").strip()


def journal(g: Guest) -> str:
    """rdmad's log since its last (re)start: the shared guest keeps earlier tests' lines."""
    return g.check(
        "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="
        "$(systemctl show -p InvocationID --value rdmad.service)",
        timeout=120,
    )


def history(g: Guest) -> list[dict[str, Any]]:
    """The history kept in rdmad's state file (empty before the first save)."""
    res = g.run(f"cat {STATE}")
    return list(json.loads(res.out).get("history", [])) if res.ok else []

"""Driving rdmad as the systemd service in a lab guest: config, (re)start, status, log, history."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from harness import ExecResult, Guest

STATE = "/var/lib/rdmad/state.json"
# rdmad logs one `reconcile.pass` line per pass only at debug level: tests that must
# see "N more passes changed nothing" put this in [daemon] and count those lines.
DEBUG_LOG = 'log_level = "debug"'


def serving_veth(g: Guest, end: str, peer: str, address: str) -> None:
    """A veth pair an rxe link on ``end`` can serve over, as status counts it: both ends
    up (a carrier, so the port is ACTIVE) and ``end`` with an IP address (the GID rdma_cm
    and RoCE v2 address it by). A link on a netdev that is down, or that has only its
    link-local GID, is present but not converged (rdmad.reconcile.rxe)."""
    g.check(
        f"ip link add {end} type veth peer name {peer} && ip link set {peer} up && "
        f"ip link set {end} up && ip addr add {address}/32 dev {end}"
    )


def write_config(g: Guest, text: str) -> None:
    g.check("mkdir -p /etc/rdmad && cat > /etc/rdmad/rdmad.toml", stdin=text.encode())


def start(g: Guest, text: str) -> None:
    """Write the config and (re)start rdmad; Type=notify returns after READY=1."""
    write_config(g, text)
    g.check("systemctl restart rdmad.service", timeout=300)


def reload(g: Guest, text: str, timeout: float = 120.0) -> None:
    """Write the config, SIGHUP rdmad and wait until the pass that re-read it has ended.

    `systemctl reload` only sends the signal. The pass that re-reads the config
    records config-reloaded (or config-invalid) and saves the state file when it
    ends, so a new such entry in the file means that pass is over.
    """
    reloads = _reloads(g)
    write_config(g, text)
    g.check("systemctl reload rdmad.service")
    g.wait_until(
        lambda: _reloads(g) > reloads,
        timeout=timeout,
        interval=0.5,
        what="rdmad's pass over the reloaded config",
    )


def _reloads(g: Guest) -> int:
    return sum(1 for h in history(g) if h["event"] in ("config-reloaded", "config-invalid"))


def stop_and_forget(g: Guest) -> None:
    """Stop rdmad and remove its config and state, for a test that needs a node rdmad
    has never seen again (a test's own guest is discarded after it: no cleanup)."""
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


def history_entries(
    g: Guest, keep: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Wait until at least count history entries satisfy keep; return them all.

    The state file is saved at the end of the pass that changed the kernel, so it
    lags what the kernel already shows: never read it once right after a change.
    """
    g.wait_until(
        lambda: len([h for h in history(g) if keep(h)]) >= count,
        timeout=timeout,
        interval=0.5,
        what=f"{count} matching entries in rdmad's history",
    )
    return [h for h in history(g) if keep(h)]


def applied(prefix: str) -> Callable[[dict[str, Any]], bool]:
    """History filter: applied kernel writes whose 'what' starts with prefix."""
    return lambda h: h["event"] == "applied" and str(h["what"]).startswith(prefix)


def passes(g: Guest, cause: str = "drift") -> int:
    """Reconcile passes with this cause logged by the current rdmad run (needs DEBUG_LOG)."""
    pattern = re.compile(rf"\bevent=reconcile\.pass\b.*\bcause={re.escape(cause)}(\s|$)")
    return sum(1 for line in journal(g).splitlines() if pattern.search(line))


def wait_passes(g: Guest, count: int, cause: str = "drift", timeout: float = 90.0) -> None:
    """Wait for count more full passes of rdmad: its own proof that they changed nothing."""
    start_at = passes(g, cause)
    g.wait_until(
        lambda: passes(g, cause) >= start_at + count,
        timeout=timeout,
        interval=0.5,
        what=f"{count} more '{cause}' passes of rdmad (after {start_at})",
    )


def ctl(g: Guest, *args: str, timeout: float = 60.0) -> ExecResult:
    """`rdmad-ctl ARGS` in the guest, as an operator runs it (no colour: not a TTY)."""
    return g.run(["rdmad-ctl", *args], timeout=timeout)


def ctl_status(g: Guest) -> tuple[ExecResult, dict[str, Any]]:
    """`rdmad-ctl status` (the table and its exit code) and `--json` (the document)."""
    table = ctl(g, "status")
    doc = ctl(g, "status", "--json")
    assert doc.rc in (0, 1), doc.describe()
    return table, dict(json.loads(doc.out))

"""The Ansible role (deploy/ansible) run inside a fresh lab guest, from nothing to a
restored node, then again (no change), then with a bad variable (refused).

The guest has no sshd and no network, and its image is not changed for this: the
controller is ansible-core from the host's `.venv-ansible` (scripts/fleet-deps.sh),
its site-packages copied into the guest once (one tar stream over the read-only 9p
share: each run then imports from the guest's disk with the venv's bytecode, ~2 s
instead of ~7 s from the share) and started with the guest's own python3 (the venv's
`bin/python` points at the host's interpreter, which the guest does not have). The
connection is local: the play runs on the node it configures. Nothing is written to
the share: Ansible's home and temp dirs are in the guest.

What counts is the kernel (sriov_numvfs, the VFs' MAC and VLAN in `ip link`, the rxe
link in `rdma link`), not what Ansible prints; its PLAY RECAP only answers "did the
second run change anything".
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from demo import virtio_nic_pci
from harness import REPO_ROOT, SRC_MOUNT, ExecResult, Guest, build_deb, log

# Three playbook runs in a 1-vCPU TCG guest: 126-130 s on the host of 2026-11-29, 651-684 s
# on 2026-11-30's (13-47 s per task); the bounds leave room for a host slower still.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

ANSIBLE_VENV = REPO_ROOT / ".venv-ansible"
HINT = "bash scripts/fleet-deps.sh makes .venv-ansible with ansible-core"
WORK = "/root/ansible-lab"  # writable, in the guest: inventory, HOME, Ansible's temp dirs
SITE = f"{WORK}/site"  # the controller's packages, copied from the share
DROPIN = "/etc/rdmad/rdmad.d/50-ansible.toml"
HOST = "lab-node"
NUMVFS = 4
RXE = "rxe0"
# VF settings declared through inventory variables: MAC and VLAN on some VFs only.
VFS = [
    {"index": 0, "mac": "02:00:00:00:0b:00", "vlan": 100},
    {"index": 1, "mac": "02:00:00:00:0b:01"},
    {"index": 3, "vlan": 303},
]
PLAYBOOK_TIMEOUT = 600.0  # one ansible-playbook run under TCG, bounded (the first: 289 s)
LOG_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) ")
# PLAY [...] starts the clock (start-up is before it); each TASK/HANDLER line ends the
# step before it; PLAY RECAP ends the last one.
LOG_STEP = re.compile(
    r"\| (?:(?:TASK|RUNNING HANDLER) \[(?:rdmad : )?([^\]]+)\]|(PLAY(?: RECAP)?))"
)
RECAP = re.compile(
    rf"^{HOST}\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)


@dataclass(frozen=True)
class Recap:
    ok: int
    changed: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class Play:
    result: ExecResult
    recap: Recap
    seconds: float


@pytest.fixture
def ansible_site() -> str:
    """The venv's site-packages, as a path in the share; skip (CI: fail) without it.

    Asked for before `node`, so a missing venv costs no guest boot.
    """
    found = sorted(ANSIBLE_VENV.glob("lib/python3.*/site-packages/ansible/cli/playbook.py"))
    if not found:
        # tests/lab/conftest.py turns this skip into a failure under CI=true.
        pytest.skip(f"no ansible-core in {ANSIBLE_VENV.name} ({HINT})")
    site = found[0].parents[2]
    return f"{SRC_MOUNT}/{site.relative_to(REPO_ROOT)}"


@pytest.fixture
def node(fresh_guest: Guest) -> Iterator[Guest]:
    """A fresh guest without rdmad, the share mounted and a work dir for Ansible.

    fresh_guest kills the guest after the test, also when it fails.
    """
    g = fresh_guest
    assert g.run("dpkg-query -W rdmad").rc != 0, "rdmad must not be installed yet"
    g.mount_src()
    g.check(f"rm -rf {WORK} && mkdir -p {WORK}/home {WORK}/tmp {SITE}")
    yield g


def _copy_controller(g: Guest, site: str) -> None:
    """The venv's site-packages into the guest (pip and setuptools left out: Ansible
    does not import them)."""
    g.check(
        f"tar -C {site} --exclude=./pip --exclude=./setuptools -cf - . | tar -C {SITE} -xf -",
        timeout=300,
    )


def _python_matches(g: Guest, site: str) -> None:
    """The venv's compiled extensions (PyYAML, MarkupSafe) are built for one minor version."""
    guest = g.check("python3 -c 'import sys; print(\"python%d.%d\" % sys.version_info[:2])'")
    venv = site.split("/lib/")[1].split("/", maxsplit=1)[0]
    assert guest.strip() == venv, (
        f"the guest's python3 is {guest.strip()}, {ANSIBLE_VENV.name} was made with {venv}: "
        "make it with a python3 of the guest's minor version"
    )


def _inventory(g: Guest, deb: Path, vfs: list[dict[str, object]]) -> dict[str, object]:
    node_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        # Already root (the guest agent runs commands as root); minbase has no sudo.
        "ansible_become": False,
        "rdmad_package_file": f"{SRC_MOUNT}/{deb.resolve().relative_to(REPO_ROOT)}",
        "rdmad_sriov": [{"pf": {"pci": g.igb_pf()}, "numvfs": NUMVFS, "vf": vfs}],
        "rdmad_rxe": [{"name": RXE, "netdev": {"pci": virtio_nic_pci(g)}}],
        "rdmad_converge_retries": 60,
        "rdmad_converge_delay": 2,
    }
    return {"rdmad_nodes": {"hosts": {HOST: node_vars}}}


def run_playbook(g: Guest, inventory: dict[str, object]) -> Play:
    """ansible-playbook deploy/ansible/site.yml inside the guest; parses its PLAY RECAP."""
    g.check(f"cat > {WORK}/inventory.yml", stdin=json.dumps(inventory, indent=1).encode())
    env = {
        "HOME": f"{WORK}/home",
        "PYTHONPATH": SITE,
        "ANSIBLE_LOCAL_TEMP": f"{WORK}/tmp",
        "ANSIBLE_REMOTE_TEMP": f"{WORK}/tmp",
        "ANSIBLE_ROLES_PATH": f"{SRC_MOUNT}/deploy/ansible/roles",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # Modules read from stdin: fewer files and processes per task (slow under TCG).
        "ANSIBLE_PIPELINING": "1",
        # Timestamped lines: where a run's time goes (logged below).
        "ANSIBLE_LOG_PATH": f"{WORK}/ansible.log",
    }
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = (
        f"cd {WORK} && env {assignments} python3 -m ansible.cli.playbook "
        f"-i inventory.yml {SRC_MOUNT}/deploy/ansible/site.yml"
    )
    g.check(f"rm -f {WORK}/ansible.log")
    started = time.monotonic()
    res = g.run(script, timeout=PLAYBOOK_TIMEOUT)
    seconds = time.monotonic() - started
    steps = task_seconds(g.run(f"cat {WORK}/ansible.log").out)
    startup = seconds - sum(took for _, took in steps)  # Python, imports: before PLAY
    log(
        f"ansible-playbook: rc={res.rc} in {seconds:.1f} s; start-up {startup:.1f} s, "
        + ", ".join(f"{name} {took:.1f} s" for name, took in steps)
    )
    found = RECAP.findall(res.out)
    assert len(found) == 1, f"no PLAY RECAP line for {HOST}\n{res.describe()}"
    return Play(res, Recap(*(int(n) for n in found[0])), seconds)


def task_seconds(ansible_log: str) -> list[tuple[str, float]]:
    """(step, seconds) from Ansible's log: PLAY up to the first task, then each task
    (and handler) up to the next step, the last one up to the PLAY RECAP."""
    marks: list[tuple[str, datetime]] = []
    for line in ansible_log.splitlines():
        stamp = LOG_STAMP.match(line)
        step = LOG_STEP.search(line)
        if stamp is None or step is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
        marks.append((step.group(1) or step.group(2), at))
    return [
        (name, (nxt - at).total_seconds()) for (name, at), (_, nxt) in itertools.pairwise(marks)
    ]


def _sha256(g: Guest, path: str) -> str:
    return g.check(f"sha256sum {path}").split()[0]


def _invocation(g: Guest) -> str:
    return g.check("systemctl show -p InvocationID --value rdmad.service").strip()


def _restored(pf_netdev: str) -> str:
    """A guest shell condition: the kernel shows every declared VF setting and the rxe link."""
    checks = [f"[ $(cat /sys/class/net/{pf_netdev}/device/sriov_numvfs) = {NUMVFS} ]"]
    checks.append(f"rdma link show {RXE}/1 >/dev/null 2>&1")
    for vf in VFS:
        pattern = f"vf {vf['index']} "
        if "mac" in vf:
            pattern += f".*link/ether {vf['mac']}"
        if "vlan" in vf:
            pattern += f".*vlan {vf['vlan']}"
        checks.append(f"ip link show {pf_netdev} | grep -q {shlex.quote(pattern)}")
    return " && ".join(checks)


def _assert_kernel(g: Guest, pf: str, pf_netdev: str, nic: str) -> None:
    assert g.numvfs(pf) == NUMVFS
    vfinfo = {vf["vf"]: vf for vf in g.vf_info(pf_netdev)}
    assert sorted(vfinfo) == list(range(NUMVFS))
    for vf in VFS:
        got = vfinfo[vf["index"]]
        if "mac" in vf:
            assert got["address"] == vf["mac"], got
        if "vlan" in vf:
            assert [v.get("vlan") for v in got.get("vlan_list", [])] == [vf["vlan"]], got
    links = {(link["ifname"], link["port"]): link for link in g.rdma_links()}
    assert (RXE, 1) in links, links
    assert links[(RXE, 1)]["netdev"] == nic, links


def test_role_converges_a_fresh_node_then_changes_nothing_then_refuses_a_bad_var(
    ansible_site: str, node: Guest
) -> None:
    g = node
    site = ansible_site
    _python_matches(g, site)
    _copy_controller(g, site)
    deb = build_deb()
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]
    nic = g.check("ls /sys/bus/virtio/drivers/virtio_net/virtio*/net").split()[0]
    assert g.numvfs(pf) == 0
    inventory = _inventory(g, deb, VFS)

    # --- 1. from nothing: installed, configured, converged --------------------------------
    first = run_playbook(g, inventory)
    assert first.result.ok, first.result.describe()
    assert first.recap.failed == 0 and first.recap.unreachable == 0, first.result.out
    assert first.recap.changed >= 3, first.result.out  # copy, install, drop-in (+ reload)
    assert g.run("dpkg-query -W -f '${Status}' rdmad").out == "install ok installed"
    assert g.check("systemctl is-active rdmad.service").strip() == "active"
    # rdmad said converged; the kernel must show it. Bounded, never a sleep.
    g.wait_for(_restored(pf_netdev), timeout=60)
    _assert_kernel(g, pf, pf_netdev, nic)
    live = _sha256(g, DROPIN)
    invocation = _invocation(g)

    # --- 2. the same inventory again: nothing changes -----------------------------------
    second = run_playbook(g, inventory)
    assert second.result.ok, second.result.describe()
    assert second.recap.changed == 0, second.result.out
    assert second.recap.failed == 0, second.result.out
    assert _sha256(g, DROPIN) == live
    assert _invocation(g) == invocation, "rdmad was restarted by a run that changed nothing"
    _assert_kernel(g, pf, pf_netdev, nic)

    # --- 3. a bad variable: the play fails, the live file and the node stay as they were --
    bad_vfs = [dict(VFS[0], mac="01:00:5e:00:00:01"), *VFS[1:]]  # multicast: not a VF MAC
    bad = run_playbook(g, _inventory(g, deb, bad_vfs))
    assert not bad.result.ok
    assert bad.recap.failed == 1, bad.result.out
    assert "failed to validate" in bad.result.out, bad.result.out
    assert "not a unicast MAC" in bad.result.out, bad.result.out  # rdmad's own reason
    assert _sha256(g, DROPIN) == live
    assert _invocation(g) == invocation
    status = g.run("rdmad-ctl status --json")
    assert status.rc == 0, status.describe()
    assert json.loads(status.out)["converged"] is True
    _assert_kernel(g, pf, pf_netdev, nic)
    log(
        f"ansible-playbook in the guest: first {first.seconds:.0f} s, "
        f"second {second.seconds:.0f} s, bad variable {bad.seconds:.0f} s"
    )

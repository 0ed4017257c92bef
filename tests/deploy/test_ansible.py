"""The rdmad Ansible role, run on this host with a local connection.

Not a lab guest (tests/lab/test_ansible_lab.py runs the role there): the live drop-in
is a temporary file, `systemctl` and `rdmad-ctl` are PATH stubs that record their
calls; `rdmad check-config` is the real one (this checkout's), so validation is real.
Checked: a first run changes and reloads (`rdmad-ctl reload`), a second run changes
nothing, a bad variable fails validation and leaves the live file as it was, and a
node that does not converge fails the play with rdmad's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, require_tool

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles: [rdmad]
"""
HINT = "bash scripts/fleet-deps.sh makes .venv-ansible with ansible-core"


def playbook_bin() -> str:
    local = ROOT / ".venv-ansible" / "bin" / "ansible-playbook"
    if local.exists():
        return str(local)
    return require_tool("ansible-playbook", HINT)


def stub(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> {bindir}/calls\n{body}\n')
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub(bindir, "systemctl", "exit 0")
    # rdmad-ctl: exit and JSON from files the test can change.
    (tmp_path / "status.rc").write_text("0")
    (tmp_path / "status.json").write_text('{"converged": true}')
    stub(bindir, "rdmad-ctl", f"cat {tmp_path}/status.json; exit $(cat {tmp_path}/status.rc)")
    stub(bindir, "rdmad", f'exec {sys.executable} -m rdmad.cli "$@"')
    (tmp_path / "etc").mkdir()
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    return tmp_path


def run(node: Path, **extra: object) -> subprocess.CompletedProcess[str]:
    variables = {
        "rdmad_install": False,
        # The modules run with ansible-playbook's own Python (a local connection).
        "ansible_python_interpreter": str(Path(playbook_bin()).parent / "python"),
        "rdmad_dropin": str(node / "etc" / "rdmad.d" / "50-ansible.toml"),
        "rdmad_bin": str(node / "bin" / "rdmad"),
        "rdmad_ctl_bin": str(node / "bin" / "rdmad-ctl"),
        "rdmad_converge_retries": 2,
        "rdmad_converge_delay": 0,
        "rdmad_sriov": [
            {
                "pf": {"pci": "0000:3b:00.0"},
                "numvfs": 4,
                "driver_guard": True,
                "vf": [{"index": 0, "mac": "02:00:00:00:0a:00", "vlan": 100}, {"index": 2}],
            }
        ],
        "rdmad_rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}],
        "rdmad_peermem_mode": "require",
    }
    variables.update(extra)
    env = dict(os.environ)
    env.update(
        PATH=f"{node / 'bin'}:{env['PATH']}",
        ANSIBLE_ROLES_PATH=str(DEPLOY / "ansible" / "roles"),
        ANSIBLE_LOCAL_TEMP=str(node / "tmp"),
        ANSIBLE_NOCOLOR="1",
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [playbook_bin(), "-i", "localhost,", "-e", json.dumps(variables), str(node / "site.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )


def recap(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.rsplit("PLAY RECAP", 1)[-1]


def reloads(node: Path) -> int:
    calls = node / "bin" / "calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return sum("rdmad-ctl reload --wait" in line for line in lines)


def test_first_run_changes_second_run_does_not(node: Path) -> None:
    first = run(node)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "changed=0" not in recap(first)
    dropin = (node / "etc" / "rdmad.d" / "50-ansible.toml").read_text()
    assert 'pci = "0000:3b:00.0"' in dropin and "numvfs = 4" in dropin
    assert dropin.count("[[sriov.vf]]") == 2 and 'mac = "02:00:00:00:0a:00"' in dropin
    assert reloads(node) == 1
    second = run(node)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "changed=0" in recap(second)
    assert reloads(node) == 1


def test_bad_variable_never_reaches_the_live_file(node: Path) -> None:
    assert run(node).returncode == 0
    live = node / "etc" / "rdmad.d" / "50-ansible.toml"
    before = live.read_text()
    bad = run(node, rdmad_sriov=[{"pf": {"pci": "0000:3b:00.0"}, "numvfs": "many"}])
    assert bad.returncode != 0
    assert "failed to validate" in bad.stdout, bad.stdout
    assert live.read_text() == before
    assert reloads(node) == 1


def test_one_inventory_wide_list_with_selectors_ranges_and_derived_macs(node: Path) -> None:
    """The group_vars form: PFs chosen by what they are, VFs by range, MACs derived on the
    node; mappings are rendered as TOML inline tables, the real check-config accepts it."""
    fleet = [
        {
            "select": {"vendor": "15b3", "device": ["1017", "101b"]},
            "numvfs": 16,
            "vf": [
                {"index": "0-7", "mac": {"derive": "pf-mac"}, "vlan": 100},
                {"index": "rest", "mac": {"derive": "machine-id"}, "trust": True},
            ],
        }
    ]
    result = run(node, rdmad_sriov=fleet, rdmad_rxe=[])
    assert result.returncode == 0, result.stdout + result.stderr
    dropin = (node / "etc" / "rdmad.d" / "50-ansible.toml").read_text()
    assert 'select = { vendor = "15b3", device = ["1017", "101b"] }' in dropin
    assert 'index = "0-7"\nmac = { derive = "pf-mac" }\nvlan = 100' in dropin
    assert 'index = "rest"\nmac = { derive = "machine-id" }\ntrust = true' in dropin


def test_not_converged_fails_with_the_reason(node: Path) -> None:
    (node / "status.rc").write_text("1")
    (node / "status.json").write_text('{"reason": "VF 3 in use by pid 42"}')
    result = run(node)
    assert result.returncode != 0
    assert "VF 3 in use by pid 42" in result.stdout


def test_site_playbook_syntax() -> None:
    result = subprocess.run(
        [
            playbook_bin(),
            "--syntax-check",
            "-i",
            "localhost,",
            str(DEPLOY / "ansible" / "site.yml"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(DEPLOY / "ansible" / "roles")},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

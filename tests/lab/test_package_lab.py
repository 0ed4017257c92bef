"""The .deb's whole life in one guest without network: install, configure, reboot,
upgrade, remove, purge.

The package under test is the one users get (scripts/build-deb.sh from this tree),
installed with `apt-get install ./rdmad_*.deb` in a guest whose user networking is
`restrict=on`: every dependency must already be in the image. One fresh guest and
one reboot for the whole lifecycle (CI time).
"""

from __future__ import annotations

import re

import pytest
import tomllib
from demo import NUMVFS, config_text, restored_condition, virtio_nic_pci
from harness import REPO_ROOT, Guest, build_deb, deb_target, log
from service import STATE, applied, history, history_entries, reload

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

CONFIG = "/etc/rdmad/rdmad.toml"


def _changelog_version() -> str:
    """The changelog's newest version with the guest release's suffix (targets.toml)."""
    first = (REPO_ROOT / "packaging/deb/debian/changelog").read_text().splitlines()[0]
    match = re.match(r"^rdmad \(([^)]+)\)", first)
    assert match, first
    with (REPO_ROOT / "packaging/targets.toml").open("rb") as f:
        suffix = tomllib.load(f)[deb_target()]["release"]
    return match.group(1) + suffix


def _show(g: Guest, prop: str) -> str:
    return g.check(f"systemctl show -p {prop} --value rdmad.service").strip()


def _package_status(g: Guest) -> str:
    return g.run("dpkg-query -W -f '${Status} ${Version}' rdmad").out.strip()


def _sha256(g: Guest, path: str) -> str:
    return g.check(f"sha256sum {path}").split()[0]


def _applied(g: Guest) -> list[dict[str, object]]:
    return [h for h in history(g) if h["event"] == "applied"]


def _vf_ifindexes(g: Guest, pf: str) -> dict[str, str]:
    """VF PCI address -> ifindex of its netdev: a re-created VF gets a new one."""
    return {
        bdf: g.read(f"/sys/bus/pci/devices/{bdf}/net/{g.pci_netdevs(bdf)[0]}/ifindex")
        for bdf in g.vf_bdfs(pf)
    }


@pytest.mark.lab_needs("reboot")
def test_deb_install_configure_reboot_upgrade_remove_purge(fresh_guest: Guest) -> None:
    g = fresh_guest
    version = _changelog_version()
    deb = build_deb()
    assert deb.name == f"rdmad_{version}_amd64.deb"
    upgrade = build_deb(f"{version}+lab1")  # scripts/test.sh built it: from the cache
    log(f"packages: {deb.name} ({deb.stat().st_size} B), {upgrade.name}")

    # --- install: offline, dependencies from the image, enabled and started ---------------
    # No package lists in the image: apt can take nothing from a repository.
    assert g.check("ls /var/lib/apt/lists/ | grep -c _Packages || true").strip() == "0"
    res = g.install_deb(deb)
    assert res.ok, res.describe()
    assert not re.search(r"^Get:\d+ \w+://", res.out, re.M), res.out
    assert re.search(r"\b1 newly installed\b", res.out), res.out  # rdmad alone, no dependency
    assert _package_status(g) == f"install ok installed {version}"
    assert g.check("for t in rdmad rdmad-ctl; do command -v $t; done").split() == [
        "/usr/bin/rdmad",
        "/usr/bin/rdmad-ctl",
    ]
    assert g.check("rdmad --version").strip() == f"rdmad {version.split('-')[0]}"
    assert g.check("systemctl is-enabled rdmad.service").strip() == "enabled"
    # Type=notify: active means READY=1 came (the first pass over the shipped config).
    assert _show(g, "ActiveState") == "active"
    assert _show(g, "StatusText") == "nothing declared"
    # The unit's Nice=-5, set by systemd before the daemon drops its capabilities.
    assert g.check("ps -o ni= -p $(systemctl show -p MainPID --value rdmad)").strip() == "-5"
    assert g.run("getent group rdmad").ok
    assert CONFIG in g.check("dpkg-query -W -f '${Conffiles}' rdmad")
    assert g.run("test -d /etc/rdmad/rdmad.d").ok
    # The guest has no man-db to look Documentation='s pages up with: --man=no, and the
    # pages the unit names are checked as files.
    for page in ("man8/rdmad.8.gz", "man5/rdmad.toml.5.gz"):
        assert g.run(f"test -s /usr/share/man/{page}").ok, page
    verify = g.run("systemd-analyze verify --man=no rdmad.service", timeout=120)
    assert (verify.rc, verify.out, verify.err) == (0, "", ""), verify.describe()
    security = g.check("systemd-analyze security rdmad.service --no-pager", timeout=120)
    installed_kib = g.check("dpkg-query -W -f '${Installed-Size}' rdmad").strip()
    log(
        f"installed size {installed_kib} KiB; "
        + next(ln for ln in security.splitlines() if "Overall exposure" in ln).strip()
    )

    # --- configure: VFs with settings and an rxe link, applied by the running service -----
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]
    text = config_text(pf, virtio_nic_pci(g))
    reload(g, text)
    condition = restored_condition(pf_netdev)
    g.wait_for(condition, timeout=180)
    numvfs_write = applied(f"{pf} sriov_numvfs: 0 -> {NUMVFS}")
    assert len(history_entries(g, numvfs_write, 1)) == 1
    config_sha = _sha256(g, CONFIG)

    # --- reboot: the enabled service restores everything ------------------------------------
    g.reboot()
    g.wait_for(condition, timeout=240)
    assert len(history_entries(g, numvfs_write, 2, timeout=120)) == 2
    assert _show(g, "ActiveState") == "active"

    # --- upgrade to a higher version: restarted, config kept, nothing restored twice --------
    before_invocation = _show(g, "InvocationID")
    before_applied = _applied(g)
    before_vfs = _vf_ifindexes(g, pf)
    res = g.install_deb(upgrade)
    assert res.ok, res.describe()
    assert re.search(r"\b1 upgraded\b", res.out), res.out
    assert _package_status(g) == f"install ok installed {version}+lab1"
    assert _show(g, "ActiveState") == "active"
    assert _show(g, "InvocationID") != before_invocation, "not restarted by the upgrade"
    assert _sha256(g, CONFIG) == config_sha
    # A pass that ends after the new daemon's first one: its history is on disk by then.
    reload(g, text)
    assert _applied(g) == before_applied
    assert _vf_ifindexes(g, pf) == before_vfs
    assert g.run(condition).ok

    # --- remove: stopped, config and state kept ------------------------------------------
    res = g.run("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q rdmad", timeout=600)
    assert res.ok, res.describe()
    assert _package_status(g).startswith("deinstall ok config-files")
    assert g.run("systemctl is-active rdmad.service").out.strip() in ("inactive", "unknown")
    assert not g.exists("/usr/bin/rdmad")
    assert not g.exists("/usr/lib/rdmad")
    assert _sha256(g, CONFIG) == config_sha
    assert g.exists(STATE)

    # --- purge: config and state gone ------------------------------------------------------
    res = g.run("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q rdmad", timeout=600)
    assert res.ok, res.describe()
    assert not g.exists(CONFIG)
    assert not g.exists("/var/lib/rdmad")
    assert g.run("dpkg-query -W -f '${Status}' rdmad").out.strip() in (
        "",
        "unknown ok not-installed",
    )

"""Other managers' SR-IOV declarations (rdmad.managers) on in-memory files: systemd's
.link/.network search path, masking, drop-ins and [Match]; NetworkManager profiles; the
SR-IOV operator's traces; a file that cannot be parsed or read."""

from __future__ import annotations

import pytest

from rdmad.managers import CannotRead, PfFacts, PfManagers, find

PCI = "0000:5e:00.0"
IGB = PfFacts(
    PCI,
    name="enp94s0f0",
    original_name=None,  # renamed by udev
    mac="52:54:00:12:34:56",
    perm_mac="52:54:00:12:34:56",
    driver="igb",
    link_type="ether",
    udev={"ID_PATH": "pci-0000:5e:00.0", "ID_NET_NAME_PATH": "enp94s0f0", "ID_BUS": "pci"},
)
OTHER = PfFacts("0000:3b:00.0", name="ens1f0", mac="b8:ce:f6:00:00:01", driver="mlx5_core")
SRIOV_LINK = (
    "[Match]\n{match}\n\n"
    "[Link]\nSR-IOVVirtualFunctions=4\n\n"
    "[SR-IOV]\nVirtualFunction=0\nTrust=yes\n"
)


class Mem:
    """``Files`` over a dict of relative paths; ``refused`` paths raise CannotRead."""

    def __init__(
        self,
        files: dict[str, str],
        links: dict[str, str] | None = None,
        refused: frozenset[str] = frozenset(),
    ) -> None:
        self.files, self.links, self.refused = files, links or {}, refused

    def _check(self, rel: str) -> None:
        if rel in self.refused:
            raise CannotRead(f"cannot read /{rel}: Permission denied")

    def names(self, rel: str) -> list[str]:
        self._check(rel)
        return sorted(
            {p[len(rel) + 1 :].split("/")[0] for p in self.files if p.startswith(rel + "/")}
        )

    def text(self, rel: str) -> str | None:
        self._check(rel)
        return self.files.get(rel)

    def link_name(self, rel: str) -> str | None:
        target = self.links.get(rel)
        return target.rsplit("/", 1)[-1] if target else None


def one(files: Mem, pf: PfFacts = IGB) -> PfManagers:
    return find(files, [pf])[pf.pci]


@pytest.mark.parametrize(
    "match",
    [
        "Driver=igb",
        "Driver=ig*",
        "Path=pci-0000:5e:00.0",
        "MACAddress=52:54:00:12:34:56",
        "PermanentMACAddress=52-54-00-12-34-56",
        "Driver=igb\nType=ether",
        "OriginalName=*",
        "Property=ID_BUS=pci",
        "Driver=!mlx5_core e1000e",
        "",  # no [Match] condition: every netdev
    ],
)
def test_a_link_file_with_sriov_that_matches_the_pf_is_a_claim(match: str) -> None:
    seen = one(Mem({"etc/systemd/network/10-pf.link": SRIOV_LINK.format(match=match)}))
    (claim,) = seen.claims
    assert (claim.manager, claim.file, claim.certain) == (
        "systemd-udevd",
        "/etc/systemd/network/10-pf.link",
        True,
    )
    assert claim.what == "SR-IOVVirtualFunctions=4; [SR-IOV] VirtualFunction=0"
    assert "systemd-udevd declares SR-IOV for this PF in /etc/systemd/network/10-pf.link" in (
        seen.describe()
    )


@pytest.mark.parametrize(
    "match",
    [
        "Driver=mlx5_core",
        "Driver=!igb",
        "Path=pci-0000:3b:00.0",
        "MACAddress=52:54:00:00:00:99",
        "Driver=igb\nType=infiniband",
        "Property=ID_BUS=usb",
        "Kind=bond",
        "Driver=mlx5_core\nDriver=\nDriver=e1000e",  # an empty assignment resets the list
    ],
)
def test_a_link_file_that_does_not_match_is_no_claim(match: str) -> None:
    seen = one(Mem({"etc/systemd/network/10-pf.link": SRIOV_LINK.format(match=match)}))
    assert seen.claims == () and not seen.contested


def test_a_network_file_with_sriov_matched_by_name() -> None:
    text = "[Match]\nName=enp94s0f*\n\n[SR-IOV]\nVirtualFunction=1\nVLANId=100\n"
    (claim,) = one(Mem({"run/systemd/network/20-pf.network": text})).claims
    assert (claim.manager, claim.file, claim.what) == (
        "systemd-networkd",
        "/run/systemd/network/20-pf.network",
        "[SR-IOV] VirtualFunction=1",
    )
    assert one(Mem({"run/systemd/network/20-pf.network": text}), OTHER).claims == ()


def test_files_without_sriov_are_no_claim() -> None:
    files = {
        "usr/lib/systemd/network/99-default.link": "[Match]\nOriginalName=*\n[Link]\n"
        "NamePolicy=keep kernel database onboard slot path\n",
        "etc/systemd/network/50-dhcp.network": "[Match]\nName=en*\n[Network]\nDHCP=yes\n",
        "etc/NetworkManager/system-connections/wired.nmconnection": (
            "[connection]\nid=wired\ntype=ethernet\ninterface-name=enp94s0f0\n"
        ),
    }
    assert not one(Mem(files)).contested


@pytest.mark.parametrize(
    ("etc", "link"),
    [("", None), ("", "/dev/null"), ("[Match]\nDriver=igb\n[Link]\nMTUBytes=9000\n", None)],
)
def test_a_same_named_file_in_etc_masks_or_replaces_one_below(etc: str, link: str | None) -> None:
    files = {
        "usr/lib/systemd/network/10-pf.link": SRIOV_LINK.format(match="Driver=igb"),
        "etc/systemd/network/10-pf.link": etc,
    }
    links = {"etc/systemd/network/10-pf.link": link} if link else {}
    assert one(Mem(files, links)).claims == ()
    # Without the file in /etc, the one below counts.
    del files["etc/systemd/network/10-pf.link"]
    assert one(Mem(files)).claims[0].file == "/usr/lib/systemd/network/10-pf.link"


def test_only_the_first_matching_link_file_applies() -> None:
    files = {
        "etc/systemd/network/05-name.link": "[Match]\nMACAddress=52:54:00:12:34:56\n"
        "[Link]\nName=lan0\n",
        "etc/systemd/network/10-pf.link": SRIOV_LINK.format(match="Driver=igb"),
    }
    assert one(Mem(files)).claims == ()
    # One that may match does not stop the search: the later one may be the one applied.
    files["etc/systemd/network/05-name.link"] = "[Match]\nHost=node1\n[Link]\nName=lan0\n"
    assert one(Mem(files)).claims[0].file == "/etc/systemd/network/10-pf.link"


def test_a_drop_in_can_add_sriov() -> None:
    files = {
        "usr/lib/systemd/network/10-pf.link": "[Match]\nDriver=igb\n[Link]\nNamePolicy=path\n",
        "etc/systemd/network/10-pf.link.d/vfs.conf": "[Link]\nSR-IOVVirtualFunctions=7\n",
    }
    (claim,) = one(Mem(files)).claims
    assert claim.file == (
        "/usr/lib/systemd/network/10-pf.link, /etc/systemd/network/10-pf.link.d/vfs.conf"
    )
    assert claim.what == "SR-IOVVirtualFunctions=7"


@pytest.mark.parametrize(
    ("match", "why"),
    [
        ("Host=node1", "[Match] Host=node1: a condition on the host"),
        ("OriginalName=eth*", "[Match] OriginalName=eth*: the PF's name before udev renamed"),
        ("WLANInterfaceType=ap", "[Match] WLANInterfaceType=ap: a key rdmad does not evaluate"),
        ("MACAddress=not-a-mac", "not a list of MAC addresses"),
    ],
)
def test_a_match_rdmad_cannot_evaluate_may_apply_and_says_why(match: str, why: str) -> None:
    seen = one(Mem({"etc/systemd/network/10-pf.link": SRIOV_LINK.format(match=match)}))
    (claim,) = seen.claims
    assert not claim.certain and why in claim.why
    assert "may declare SR-IOV for this PF" in seen.describe() and why in seen.describe()


def test_a_file_that_cannot_be_parsed_and_mentions_sriov_may_apply() -> None:
    broken = "[Match]\nDriver=igb\n[SR-IOV\nVirtualFunction=0\n"
    seen = one(Mem({"etc/systemd/network/10-pf.link": broken}))
    (claim,) = seen.claims
    assert not claim.certain
    assert (
        claim.why
        == "/etc/systemd/network/10-pf.link: line 3: a section header without its closing ]"
    )
    # One that does not mention SR-IOV cannot declare it.
    assert not one(Mem({"etc/systemd/network/10-x.link": "[Match]\nDriver igb\n"})).contested


NM = "etc/NetworkManager/system-connections"


@pytest.mark.parametrize(
    "bind",
    [
        "[connection]\ninterface-name=enp94s0f0\n",
        "[ethernet]\nmac-address=52:54:00:12:34:56\n",
        "[match]\ninterface-name=enp94s0*;!enp94s0f1\n",
        "[match]\ndriver=igb\npath=pci-0000:5e:00.0\n",
    ],
)
def test_a_networkmanager_profile_with_sriov_for_the_pf(bind: str) -> None:
    text = f"[connection]\nid=pf\ntype=ethernet\n{bind}\n[sriov]\ntotal-vfs=4\nvfs=0 trust=true\n"
    (claim,) = one(Mem({f"{NM}/pf.nmconnection": text})).claims
    assert (claim.manager, claim.file, claim.certain) == (
        "NetworkManager",
        f"/{NM}/pf.nmconnection",
        True,
    )
    assert claim.what == "[sriov] total-vfs=4; [sriov] vfs=0 trust=true"
    assert one(Mem({f"{NM}/pf.nmconnection": text}), OTHER).claims == ()


def test_a_networkmanager_profile_for_no_device_may_apply() -> None:
    text = "[connection]\nid=any\ntype=ethernet\n[sriov]\ntotal-vfs=2\n"
    (claim,) = one(Mem({f"{NM}/any.nmconnection": text})).claims
    assert not claim.certain and "names no device" in claim.why


def test_networkmanager_reads_only_nmconnection_files_outside_etc() -> None:
    text = "[connection]\ninterface-name=enp94s0f0\n[sriov]\ntotal-vfs=4\n"
    assert one(Mem({"run/NetworkManager/system-connections/pf": text})).claims == ()
    assert one(Mem({f"{NM}/pf.nmconnection~": text})).claims == ()
    assert len(one(Mem({f"{NM}/pf": text})).claims) == 1


def test_the_sriov_operator_traces_name_the_pf_exactly() -> None:
    stored = one(Mem({f"etc/sriov-operator/pci/{PCI}": '{"pciAddress":"0000:5e:00.0"}'}))
    (claim,) = stored.claims
    assert (claim.manager, claim.file) == (
        "sriov-network-operator",
        f"/etc/sriov-operator/pci/{PCI}",
    )
    systemd_mode = "spec:\n  interfaces:\n  - pciAddress: 0000:5e:00.0\n    numVfs: 4\n"
    files = Mem({"etc/sriov-operator/sriov-interface-config.yaml": systemd_mode})
    assert one(files).claims[0].file == "/etc/sriov-operator/sriov-interface-config.yaml"
    assert one(files, OTHER).claims == ()


def test_a_directory_that_cannot_be_read_makes_every_pf_unknown() -> None:
    files = Mem({f"{NM}/x.nmconnection": "[connection]\n"}, refused=frozenset({NM}))
    found = find(files, [IGB, OTHER])
    for seen in found.values():
        assert seen.claims == () and seen.contested
        assert seen.unknown == (f"cannot read /{NM}: Permission denied",)
        assert "is unknown: cannot read" in seen.describe()

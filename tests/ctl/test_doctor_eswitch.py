"""The doctor's eSwitch check (rdmad/doctor/eswitch.py) on fake sysfs trees with a
scripted devlink, and its devlink read (rdmad/doctor/devlink.py) over a scripted
socket answering with the codec's own messages: what it reports for a PF as declared,
one that differs (with the VFs a mode change would re-create), one without an eSwitch,
an unreadable one (EPERM is "not read", never "none") and a --root tree (not asked)."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from rdmad.doctor import Root, run_checks
from rdmad.doctor.devlink import HostDevlink
from rdmad.doctor.eswitch import Seen
from rdmad.doctor.report import Check
from rdmad.kernel.netlink import devlink_codec as dl
from rdmad.kernel.netlink.nlcodec import NLMSG_ERROR, asciiz, attr, pack_message, split_messages
from tests.support.fakesysfs import FakeSysfs

CX = "0000:3b:00.0"
E810 = "0000:af:00.0"
FAMILY = 0x15


def node(root: Path, numvfs: int = 0) -> FakeSysfs:
    fs = FakeSysfs(root)
    fs.pf(CX, "mlx5_core", totalvfs=16, numvfs=numvfs)
    for i in range(numvfs):
        fs.vf(CX, i, f"0000:3b:00.{i + 2}", "vfio-pci" if i == 0 else None, 40 + i)
    fs.pf(E810, "ice", totalvfs=64)
    return fs


def check(tmp_path: Path, toml: str, devlink: object) -> Check | None:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "rdmad.toml").write_text(toml)
    report = run_checks(Root(str(tmp_path / "root")), str(etc), devlink)  # type: ignore[arg-type]
    return next((c for c in report.checks if c.id == "eswitch"), None)


def reader(answers: dict[str, Seen]) -> object:
    return lambda pf: answers[pf]


SWITCHDEV = f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 2\neswitch = {{ mode = "switchdev" }}\n'


def test_as_declared_is_ok_and_an_undeclared_pf_is_shown(tmp_path: Path) -> None:
    node(tmp_path / "root")
    toml = SWITCHDEV + f'\n[[sriov]]\npf = {{ pci = "{E810}" }}\nnumvfs = 4\n'
    seen = {
        CX: Seen("switchdev", "link", "basic"),
        E810: Seen("legacy"),
    }
    c = check(tmp_path, toml, reader(seen))
    assert c is not None and c.status == "ok", c
    assert c.summary == "1 declared eSwitch mode(s) as declared"
    assert c.evidence == (
        f"pf pci={CX} ({CX}): mode switchdev, inline-mode link, encap-mode basic",
        f"pf pci={E810} ({E810}): mode legacy",
    )


def test_differs_under_vfs_lists_them(tmp_path: Path) -> None:
    node(tmp_path / "root", numvfs=2)
    toml = SWITCHDEV.replace('mode = "switchdev"', 'mode = "switchdev", inline_mode = "link"')
    c = check(tmp_path, toml, reader({CX: Seen("legacy")}))
    assert c is not None and c.status == "warn", c
    assert c.evidence == (
        f"pf pci={CX} ({CX}): mode legacy; declared mode switchdev",
        "  the driver reports no inline-mode: rdmad reports the declared link "
        "unsupported-by-driver",
        "  2 VF(s) exist: a mode change re-creates them, so rdmad makes it only while none "
        "is in use",
        "  vf 0 (0000:3b:00.2): vfio-pci",
        "  vf 1 (0000:3b:00.3): no driver",
    )
    assert "rdmad-ctl status" in c.suggestion


def test_an_option_the_driver_lacks_is_said_once_not_pending(tmp_path: Path) -> None:
    node(tmp_path / "root")
    toml = SWITCHDEV.replace('mode = "switchdev"', 'mode = "switchdev", encap_mode = "basic"')
    c = check(tmp_path, toml, reader({CX: Seen("switchdev")}))
    assert c is not None and c.status == "warn", c
    assert c.summary == "1 PF(s) declare eSwitch options their driver does not have"
    assert c.evidence == (
        f"pf pci={CX} ({CX}): mode switchdev",
        "  the driver reports no encap-mode: rdmad reports the declared basic "
        "unsupported-by-driver",
    )


def test_declared_on_a_pf_without_an_eswitch_fails(tmp_path: Path) -> None:
    node(tmp_path / "root")
    c = check(tmp_path, SWITCHDEV, reader({CX: Seen(absent="its driver has none")}))
    assert c is not None and c.status == "fail", c
    assert c.evidence == (
        f"pf pci={CX} ({CX}): no eSwitch (its driver has none); declared mode switchdev",
    )


def test_unread_is_unknown_not_none(tmp_path: Path) -> None:
    node(tmp_path / "root")
    c = check(tmp_path, SWITCHDEV, reader({CX: Seen(unread="Operation not permitted")}))
    assert c is not None and c.status == "unknown", c
    assert c.evidence == (
        f"pf pci={CX} ({CX}): not read: Operation not permitted; declared mode switchdev",
    )


def test_a_tree_is_not_asked_and_no_pf_no_check(tmp_path: Path) -> None:
    node(tmp_path / "root")
    c = check(tmp_path, SWITCHDEV, None)
    assert c is not None and c.status == "unknown"
    assert c.evidence == ("devlink is asked only about this host, not about a --root tree",)
    assert check(tmp_path, f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 2\n', None) is None
    assert check(tmp_path, "[rdma]\n", reader({})) is None


def test_a_netdevsim_pf_by_its_netdev(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path / "root")
    fs.write("sys/bus/netdevsim/devices/netdevsim41/sriov_numvfs", "2")
    fs.link("sys/class/net/eni41np1/device", "../../../bus/netdevsim/devices/netdevsim41")
    toml = '[[sriov]]\npf = { name = "eni41np1" }\nnumvfs = 2\neswitch = { mode = "switchdev" }\n'
    c = check(tmp_path, toml, reader({"netdevsim41": Seen("legacy")}))
    assert c is not None and c.status == "warn"
    assert c.evidence[1:] == (
        "  2 VF(s) exist: a mode change re-creates them, so rdmad makes it only while none "
        "is in use",
        "  vf 0 (netdevsim41 vf 0): no driver",
        "  vf 1 (netdevsim41 vf 1): no driver",
    )
    etc = tmp_path / "etc"
    [sriov] = [
        c for c in run_checks(Root(str(tmp_path / "root")), str(etc)).checks if c.id == "sriov"
    ]
    assert sriov.status == "ok" and sriov.evidence == (
        "pf name=eni41np1 (netdevsim41): a netdevsim test device",
    )


# --- the devlink read over a scripted socket ---------------------------------------------


class Socket:
    """Answers each request as a kernel would: the controller with devlink's family
    id (or ENOENT), the eSwitch question with ``answer`` (modes or an errno)."""

    def __init__(self, answer: tuple[int, int] | int, family: int | None = FAMILY) -> None:
        self.answer, self.family = answer, family
        self.pending: list[bytes] = []
        self.asked: list[int] = []
        self.closed = False

    def send(self, data: bytes) -> int:
        (req,) = split_messages(data)
        self.asked.append(req.type)
        if req.type == dl.GENL_ID_CTRL:
            if self.family is None:
                self.pending.append(self._error(req.seq, errno.ENOENT))
            else:
                body = attr(dl.CTRL_ATTR_FAMILY_ID, struct.pack("=H", self.family))
                self.pending.append(dl.genl(dl.GENL_ID_CTRL, 1, 0, req.seq, body))
        elif isinstance(self.answer, int):
            self.pending.append(self._error(req.seq, self.answer))
        else:
            mode, inline = self.answer
            body = (
                attr(dl.ATTR_BUS_NAME, asciiz("pci"))
                + attr(dl.ATTR_DEV_NAME, asciiz(CX))
                + attr(dl.ATTR_ESWITCH_MODE, struct.pack("=H", mode))
                + attr(dl.ATTR_ESWITCH_INLINE_MODE, bytes([inline]))
            )
            # A late answer to an earlier question first: it must be skipped.
            self.pending.append(dl.genl(FAMILY, dl.CMD_ESWITCH_GET, 0, req.seq - 1, b""))
            self.pending.append(dl.genl(FAMILY, dl.CMD_ESWITCH_GET, 0, req.seq, body))
        return len(data)

    @staticmethod
    def _error(seq: int, code: int) -> bytes:
        return pack_message(NLMSG_ERROR, 0, seq, struct.pack("=i", -code) + bytes(16))

    def recv(self, _size: int) -> bytes:
        return b"".join(self.pending.pop(0) for _ in range(len(self.pending)))

    def close(self) -> None:
        self.closed = True


def ask(sock: Socket, times: int = 1) -> list[Seen]:
    devlink = HostDevlink(lambda: sock)  # type: ignore[arg-type,return-value]
    try:
        return [devlink(CX) for _ in range(times)]
    finally:
        devlink.close()
        assert sock.closed


def test_read_switchdev() -> None:
    assert ask(Socket((1, 1))) == [Seen("switchdev", "link")]


@pytest.mark.parametrize(
    ("code", "expect"),
    [
        (errno.EOPNOTSUPP, Seen(absent="its driver has none")),
        (errno.ENODEV, Seen(absent=f"its driver registers no devlink instance pci/{CX}")),
        (
            errno.EPERM,
            Seen(
                unread="Operation not permitted (reading an eSwitch needs CAP_NET_ADMIN: "
                "run as root)"
            ),
        ),
        (errno.EIO, Seen(unread="Input/output error")),
    ],
)
def test_read_failures(code: int, expect: Seen) -> None:
    assert ask(Socket(code)) == [expect]


def test_a_kernel_without_devlink_is_asked_once() -> None:
    sock = Socket((1, 0), family=None)
    assert ask(sock, times=2) == [Seen(absent="this kernel has no devlink")] * 2
    assert sock.asked == [dl.GENL_ID_CTRL]

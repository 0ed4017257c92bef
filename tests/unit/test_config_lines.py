"""Config errors name the file, the line and the key (rdmad/config/lines.py), and a value
whose TOML type is not the key's is refused (issue #60): "8" is not an integer and
"false" is not a boolean."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.config import ConfigInvalid, load
from rdmad.config.lines import line_of

SAMPLE = """# comment
[daemon]
drift_interval = "1h"
settle = "x"

[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 8

[[sriov.vf]]
index = 0
vlan = 100

[[sriov.vf]]
index = 1
mac = "bad"

[[sriov]]
pf = { name = "eth1" }
numvfs = 2
vf = [ { index = 0, mac = "x" } ]

[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }
"""


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("daemon", 2),
        ("daemon.settle", 4),
        ("sriov[0]", 6),
        ("sriov[0].pf.pci", 7),  # in an inline table: the line of the key holding it
        ("sriov[0].numvfs", 8),
        ("sriov[0].vf[0].vlan", 12),
        ("sriov[0].vf[1].mac", 16),
        ("sriov[1].numvfs", 20),
        ("sriov[1].vf[0].mac", 21),  # in an inline array
        ("rxe[0].netdev", 25),
        ("api.listen", None),  # not in the file
    ],
)
def test_the_line_of_a_key(path: str, line: int | None) -> None:
    assert line_of(SAMPLE, path) == line


def errors(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "rdmad.toml").write_text(text)
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path)
    return [str(e) for e in caught.value.errors]


PF = '[[sriov]]\npf = { pci = "0000:3b:00.0" }\n'


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (PF + 'numvfs = "8"\n', ":3: sriov[0].numvfs: expected an integer, got a string"),
        (PF + "numvfs = 1e1\n", ":3: sriov[0].numvfs: expected an integer, got a number"),
        (
            PF + 'numvfs = 2\n[[sriov.vf]]\nindex = 0\nvlan = "100"\n',
            ":6: sriov[0].vf[0].vlan: expected an integer, got a string",
        ),
        (
            PF + 'numvfs = 2\ndriver_guard = "false"\n',
            ":4: sriov[0].driver_guard: expected true or false",
        ),
        (
            PF + 'numvfs = 2\ndriver_guard = "0"\n',
            ":4: sriov[0].driver_guard: expected true or false",
        ),
        (
            PF + "numvfs = 2\ndriver_guard = 0\n",
            ":4: sriov[0].driver_guard: expected true or false",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_file_line_and_key(
    tmp_path: Path, text: str, want: str
) -> None:
    [err] = errors(tmp_path, text)
    assert err.startswith(f"{tmp_path / 'rdmad.toml'}{want}"), err


def test_an_unknown_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    text = PF + 'num_vfs = 2\n[daemon]\ndrift_intervall = "1h"\nfoo = 1\n'
    path = tmp_path / "rdmad.toml"
    assert errors(tmp_path, text) == [
        f"{path}:3: sriov[0].num_vfs: unknown key (did you mean 'numvfs'?)",
        f"{path}:1: sriov[0].numvfs: required key is missing",
        f"{path}:5: daemon.drift_intervall: unknown key (did you mean 'drift_interval'?)",
        f"{path}:6: daemon.foo: unknown key",
    ]

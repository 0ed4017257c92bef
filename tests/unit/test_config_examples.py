"""Every config example an operator reads, in rdmad.toml(5) and in
docs/CONFIG-REFERENCE.md, is a file `rdmad check-config` accepts: the blocks are read
back out of the pages as they are shipped, not taken from the module that makes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rdmad import cli, configguide, configref, exits, manpages

ROOT = Path(__file__).resolve().parents[2]


def man_blocks() -> list[str]:
    """The no-fill blocks of rdmad.toml(5)'s EXAMPLES section, as the reader sees them."""
    page = manpages.config_page("9.9.9")
    section = page.split("\n.SH EXAMPLES\n", 1)[1].split("\n.SH ", 1)[0]
    blocks = re.findall(r"^\.nf\n(.*?)\n\.fi$", section, re.S | re.M)
    return [
        "\n".join(ln.removeprefix("\\&") for ln in b.splitlines())
        .replace("\\-", "-")
        .replace("\\e", "\\")
        + "\n"
        for b in blocks
    ]


def markdown_blocks() -> list[str]:
    """The ```toml blocks of the checked-in docs/CONFIG-REFERENCE.md's Examples."""
    page = (ROOT / "docs" / "CONFIG-REFERENCE.md").read_text()
    section = page.split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```toml\n(.*?)^```$", section, re.S | re.M)


def check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`rdmad check-config --config PATH`, the command's own code path."""
    rc = cli.main(["check-config", "--config", str(path)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_both_pages_show_every_example_line_for_line() -> None:
    wanted = [ex.toml for ex in configguide.EXAMPLES]
    assert len(wanted) >= 4
    assert man_blocks() == wanted
    assert markdown_blocks() == wanted


@pytest.mark.parametrize("where", ["rdmad.toml(5)", "CONFIG-REFERENCE.md"])
def test_every_example_block_passes_check_config(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = man_blocks() if where == "rdmad.toml(5)" else markdown_blocks()
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"example-{i}.toml"
        path.write_text(block)
        path.chmod(0o644)
        rc, out = check_config(path, capsys)
        assert rc == 0, f"{where} example {i} is refused:\n{block}\n{out}"
        assert out.startswith(f"config OK: {path}"), out


def test_the_examples_declare_what_their_titles_say() -> None:
    """Not empty files that pass by declaring nothing: VFs with VLANs and a driver, an rxe
    link, an explicit peermem mode, InfiniBand GUIDs."""
    text = "\n".join(ex.toml for ex in configguide.EXAMPLES)
    assert re.search(r"^vlan = \d+$", text, re.M) and 'driver = "vfio-pci"' in text
    assert re.search(r"^\[\[rxe\]\]$", text, re.M)
    assert re.search(r'^\[peermem\]\nmode = "(auto|require)"$', text, re.M)
    assert "node_guid = " in text and "port_guid = " in text


def test_a_broken_example_would_fail_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check is real: the same path refuses an example with a VLAN out of range."""
    first = configguide.EXAMPLES[0].toml
    path = tmp_path / "broken.toml"
    path.write_text(first.replace("vlan = 100", "vlan = 5000", 1))
    path.chmod(0o644)
    rc, out = check_config(path, capsys)
    assert rc == exits.CONFIG_INVALID
    assert "vlan" in out


def test_the_reference_page_is_current() -> None:
    assert (ROOT / "docs" / "CONFIG-REFERENCE.md").read_text() == configref.page()

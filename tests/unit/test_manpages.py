"""The man pages (rdmad/manpages.py, made at package build time) say what `--help` says:
every option and every sub-command's details of rdmad(8) and rdmad-ctl(8), every table
and key of rdmad.toml(5); a rebuild at the same time gives the same bytes."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Callable, Iterator

import pytest

from rdmad import cli, configref, exits, manpages
from rdmad.ctl import args as ctl_args


@pytest.fixture(scope="module", autouse=True)
def _fixed_build_time() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01
        mp.setenv("COLUMNS", "80")
        yield


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return manpages.pages("9.9.9")


def text_of(troff: str) -> str:
    """The words of a page as a reader sees them: font changes and escapes removed,
    whitespace collapsed (troff refills lines)."""
    out = re.sub(r"\\f[BIRP]|\\/|\\,|\\&", "", troff)
    out = out.replace("\\-", "-").replace("\\e", "\\")
    return " ".join(out.split())


def help_of(parser: Callable[..., argparse.ArgumentParser], *argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser().parse_args([*argv, "--help"])
    return out.getvalue()


def options_in(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))


def test_every_option_of_rdmad_is_on_its_page(pages: dict[str, str]) -> None:
    page = text_of(pages["man8/rdmad.8"])
    for command in ("", "check-config", "plan", "snapshot", "run"):
        text = help_of(cli.parser, *([command] if command else []))
        for option in options_in(text) - {"-h", "--help"}:
            assert option in page, f"rdmad {command} {option} is not in rdmad(8)"
    # Each sub-command's one-line help, as the top-level --help lists it.
    listed = re.findall(r"^    (check-config|plan|snapshot|run)\s+(.+)$", help_of(cli.parser), re.M)
    assert len(listed) == 4
    for _, summary in listed:
        assert summary in page


@pytest.mark.parametrize("command", sorted(ctl_args.COMMANDS))
def test_every_option_and_detail_of_rdmad_ctl_is_on_its_page(
    pages: dict[str, str], command: str
) -> None:
    page = text_of(pages["man8/rdmad-ctl.8"])
    text = help_of(ctl_args.parser, command)
    for option in options_in(text) - {"-h", "--help"}:
        assert option in page, f"rdmad-ctl {command} {option} is not in rdmad-ctl(8)"
    summary, details = ctl_args.COMMANDS[command]
    assert summary in page
    for line in details.splitlines():
        # Backticks in --help are bold in the page.
        assert " ".join(line.replace("`", "").split()) in page, (command, line)


def test_rdmad_ctl_epilog_is_kept_line_for_line(pages: dict[str, str]) -> None:
    """Examples are laid out by hand: the page keeps each line (the exit codes are in
    EXIT STATUS: tests/unit/test_exit_codes.py)."""
    troff = pages["man8/rdmad-ctl.8"]
    assert ".nf" in troff
    page_lines = {" ".join(text_of(ln).split()) for ln in troff.splitlines()}
    for line in ctl_args.EPILOG.replace(exits.help_text(), "").splitlines():
        if line.strip():
            assert " ".join(line.replace("`", "").split()) in page_lines, line


def test_rdmad_toml_page_lists_every_table_and_key(pages: dict[str, str]) -> None:
    troff = pages["man5/rdmad.toml.5"]
    assert troff.startswith('.TH RDMAD.TOML "5" "2026-01-01" "rdmad 9.9.9"')
    page = text_of(troff)
    for table in configref.tables():
        name = f"[[{table.path}]]" if table.array else f"[{table.path}]"
        assert f".SS {manpages.troff(name)}" in troff
        for key in table.keys:
            assert f"\\fB{manpages.troff(key.key)}\\fR" in troff
            assert " ".join(key.meaning.replace("`", "").split())[:60] in page.replace("`", "")


def test_no_line_of_a_page_starts_a_stray_request(pages: dict[str, str]) -> None:
    """A text line starting with "." or "'" would be read as a troff request."""
    known = re.compile(r"^\.(TH|SH|SS|TP|PP|B|br|nf|fi|IP|RS|RE|I|BR|IR)\b")
    for name, troff in pages.items():
        for line in troff.splitlines():
            if line.startswith((".", "'")):
                assert known.match(line), f"{name}: {line!r}"


def test_pages_are_reproducible(pages: dict[str, str]) -> None:
    assert manpages.pages("9.9.9") == pages
    for name in ("man8/rdmad.8", "man8/rdmad-ctl.8"):
        assert '"2026\\-01\\-01" "rdmad 9.9.9"' in pages[name].splitlines()[0]


def test_troff_escapes() -> None:
    assert manpages.troff("a-b `c` [d](e.md) x\\y") == "a\\-b \\fBc\\fR d x\\ey"
    assert manpages.troff(".start\n'quote") == "\\&.start\n\\&'quote"

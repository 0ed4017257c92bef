"""The .deb: its files, control fields, conffiles, maintainer scripts, lintian."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from tests.packaging.conftest import REPO, build, need
from tests.packaging.test_completions import wanted
from tests.packaging.test_docs import DOC, deb_docs
from tests.packaging.test_fleet_files import wanted as fleet_files

SITE = "usr/lib/rdmad/lib/python3.11/site-packages"


def _control_field(control: Path, name: str) -> str:
    text = (control / "control").read_text()
    match = re.search(rf"^{name}: (.*(?:\n .*)*)", text, re.M)
    assert match, f"no {name} in the control file"
    return match.group(1)


def test_deb_ships_the_venv_commands_unit_config_and_docs(deb_tree: Path) -> None:
    for path in (
        "usr/bin/rdmad",
        "usr/bin/rdmad-ctl",
        "usr/lib/rdmad/pyvenv.cfg",
        f"{SITE}/rdmad/__init__.py",
        f"{SITE}/rdmad/__pycache__/__init__.cpython-311.pyc",
        f"{SITE}/msgspec/__init__.py",
        f"{SITE}/aiohttp/__init__.py",
        "lib/systemd/system/rdmad.service",
        "lib/systemd/system/rdmad-wait-converged.service",
        "usr/lib/sysusers.d/rdmad.conf",
        "usr/share/rdmad/metrics-tcp.conf",
        "etc/rdmad/rdmad.toml",
        "usr/share/doc/rdmad/examples/rdmad.toml",
        "usr/share/doc/rdmad/README.md",  # the unit's Documentation=, so not compressed
        "usr/share/doc/rdmad/API.md",  # named by --help and error answers
        "usr/share/man/man8/rdmad.8.gz",
        "usr/share/man/man8/rdmad-ctl.8.gz",
        "usr/share/man/man5/rdmad.toml.5.gz",
    ):
        assert (deb_tree / path).exists(), path
    assert (deb_tree / "etc/rdmad/rdmad.d").is_dir()
    # Every document the packaging files ship (test_docs.py reads them), uncompressed, and
    # the node's README as the README.
    for dest, src in deb_docs().items():
        assert (deb_tree / DOC / dest).read_bytes() == src.read_bytes(), dest
    # No static drop-in for openibd.service: rdmad writes one, from the unit's own
    # ExecStop=, only while a guard is declared.
    assert not list(deb_tree.rglob("openibd.service.d"))
    # The venv runs on the system's python3.11 (a Depends), wherever dh_link pointed it.
    python = deb_tree / "usr/lib/rdmad/bin/python3"
    assert os.path.normpath(python.parent / os.readlink(python)) == str(
        deb_tree / "usr/bin/python3.11"
    )
    # No pip, setuptools or build tools left in the runtime venv.
    names = {p.name.split("-")[0].lower() for p in (deb_tree / SITE).glob("*.dist-info")}
    assert not names & {"pip", "setuptools", "wheel", "packaging", "argparse_manpage"}
    for src, dest in wanted("deb").items():
        assert (deb_tree / dest.lstrip("/")).read_bytes() == (
            REPO / "completion" / src
        ).read_bytes()
    # The fleet's Prometheus rules and Grafana dashboard, as in the tree.
    for source, installed in fleet_files().items():
        shipped = (deb_tree / installed.lstrip("/")).read_bytes()
        assert shipped == (REPO / source).read_bytes(), installed
    assert not (deb_tree / "usr/share/rdmad/prometheus/rules_test.yml").exists()


def test_deb_bytecode_is_read_without_its_source(deb_tree: Path) -> None:
    """Every shipped .pyc is an unchecked-hash pyc (PEP 552: flags word 0b01): an import
    reads it alone, where a checked-hash one (0b11) reads and hashes the source again and
    a timestamp one (0) depends on file times the package does not keep."""
    pycs = sorted((deb_tree / SITE).rglob("*.pyc"))
    assert len(pycs) > 100, "the venv ships its bytecode"
    flags = {p.relative_to(deb_tree / SITE).as_posix(): p.read_bytes()[4:8] for p in pycs}
    wrong = {name: f.hex() for name, f in flags.items() if int.from_bytes(f, "little") != 0b01}
    assert not wrong, f"not unchecked-hash: {dict(list(wrong.items())[:5])}"


def test_deb_man_pages_cover_every_command(deb_tree: Path) -> None:
    """Made at build time from the installed parsers (rdmad/manpages.py)."""
    import gzip

    from rdmad.ctl.args import COMMANDS

    ctl = gzip.decompress((deb_tree / "usr/share/man/man8/rdmad-ctl.8.gz").read_bytes()).decode()
    for command in COMMANDS:
        assert re.search(rf"^\.SH COMMAND .*'rdmad\\-ctl {command}'", ctl, re.M), command
    toml = gzip.decompress((deb_tree / "usr/share/man/man5/rdmad.toml.5.gz").read_bytes()).decode()
    assert ".SS [[sriov.vf]]" in toml and "driver_guard" in toml


def test_deb_names_no_build_path(deb_tree: Path) -> None:
    """A venv is not relocatable: nothing may point into the build directory."""
    proc = subprocess.run(
        ["grep", "-rlE", "/tmp/rdmad-deb|debian/rdmad/usr", str(deb_tree)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout == "", proc.stdout


def test_deb_wrappers_run_the_entry_points_isolated(deb_tree: Path) -> None:
    text = (deb_tree / "usr/bin/rdmad").read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "exec /usr/lib/rdmad/bin/python3 -I -c" in text
    assert "from rdmad.cli import main" in text
    assert 'sys.argv[0] = "rdmad"' in text
    assert "from rdmad.ctl import main" in (deb_tree / "usr/bin/rdmad-ctl").read_text()


def test_deb_config_is_a_conffile_that_declares_nothing(deb_tree: Path, deb_control: Path) -> None:
    assert (deb_control / "conffiles").read_text().split() == ["/etc/rdmad/rdmad.toml"]
    # Every TOML table or key is commented out except [daemon]: nothing is managed.
    live = [
        ln
        for ln in (deb_tree / "etc/rdmad/rdmad.toml").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert live == ["[daemon]"]
    checker = REPO / ".venv" / "bin" / "rdmad"
    if checker.exists():
        proc = subprocess.run(
            [str(checker), "check-config", "--config", str(deb_tree / "etc/rdmad/rdmad.toml")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 SR-IOV PF(s), 0 rxe link(s)" in proc.stdout


def test_deb_depends_on_the_interpreter_and_tools_only(deb_control: Path) -> None:
    depends = {d.strip().split(" ")[0] for d in _control_field(deb_control, "Depends").split(",")}
    assert {"python3.11", "systemd", "kmod", "libc6"} <= depends
    # No python3-* distribution packages: the venv carries every library.
    assert not [d for d in depends if d.startswith("python3-")]
    assert _control_field(deb_control, "Architecture") == "amd64"


def test_deb_maintainer_scripts(deb_control: Path) -> None:
    postinst = (deb_control / "postinst").read_text()
    # The group first, then enable, then start (install) or restart (upgrade).
    sysusers = postinst.index("systemd-sysusers")
    enable = postinst.index("deb-systemd-helper enable 'rdmad.service'")
    start = postinst.index("deb-systemd-invoke $_dh_action 'rdmad.service'")
    assert sysusers < enable < start
    assert "_dh_action=restart" in postinst
    # The wait unit is for consumers to pull in: never enabled, started or restarted by
    # the package (an upgrade would wait for the node to converge).
    for script in ("postinst", "prerm", "postrm"):
        assert "rdmad-wait-converged" not in (deb_control / script).read_text(), script
    prerm = (deb_control / "prerm").read_text()
    assert re.search(r'\[ "\$1" = remove \].*\n\s*deb-systemd-invoke stop', prerm)
    postrm = (deb_control / "postrm").read_text()
    assert re.search(r'if \[ "\$1" = "purge" \]; then\n\s*rm -rf /var/lib/rdmad\n', postrm)
    # The guard's hook names the removed interpreter: it goes on remove already.
    remove_or_purge = r'"\$1" = "remove" \] \|\| \[ "\$1" = "purge" \]; then\n'
    assert re.search(remove_or_purge + r"\s*rm -f /etc/modprobe.d/rdmad-guard.conf", postrm)


def test_deb_is_lintian_clean(deb: Path) -> None:
    """Clean but for the overrides in debian/rdmad.lintian-overrides, each with its reason."""
    need("lintian")
    proc = subprocess.run(
        ["lintian", "--pedantic", "--fail-on", "error,warning,info,pedantic", str(deb)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tags = [ln for ln in proc.stdout.splitlines() if re.match(r"^[EWIPX]: ", ln)]
    assert (proc.returncode, tags) == (0, []), proc.stdout + proc.stderr


def test_the_same_tree_builds_the_same_bytes(deb: Path, tmp_path: Path) -> None:
    """Reproducible: this tree built again (another cache, another time) is the same .deb,
    byte for byte. The lab keys the installed state it starts guests from by the .deb's
    digest: a build that differs by a timestamp made that state again on every clone."""
    again = build("build-deb.sh", "--out", str(tmp_path))
    assert again != deb
    assert (
        hashlib.sha256(again.read_bytes()).hexdigest()
        == hashlib.sha256(deb.read_bytes()).hexdigest()
    )

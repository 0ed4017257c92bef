"""The guard's host copy (rdmad.kernel.guardkit), run as the host runs it: its hook
script under /bin/sh, the copy under this machine's python3 with no site-packages
(-I -S), and the fail-open paths with a stub modprobe that records what it was asked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rdmad.kernel import guardhook, guardkit


@pytest.fixture
def stub_modprobe(tmp_path: Path) -> Path:
    stub = tmp_path / "modprobe"
    stub.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path}/modprobe.log\nexit 0\n')
    stub.chmod(0o755)
    return stub


def _calls(stub: Path) -> list[str]:
    log = stub.parent / "modprobe.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_copy_runs_on_the_hosts_python_without_site_packages(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    """The hook runs the copied guard with python3 -I -S: it imports only the standard
    library, and answers (here: nothing of that name is loaded, so nothing to hold)."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on this machine's PATH")  # Debian always has one
    hook = guardkit.install(tmp_path / "guard", str(stub_modprobe))
    assert os.access(hook, os.X_OK)
    proc = subprocess.run(
        [hook, "check", "rdmad-no-such-driver0", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["allowed"] is True
    assert answer["decisions"][0]["checked"] == [
        "no module or PCI driver rdmad-no-such-driver0 is loaded"
    ]
    assert _calls(stub_modprobe) == []  # a check unloads nothing


def test_without_a_python_it_lets_the_unload_go_ahead_and_says_why(
    tmp_path: Path, stub_modprobe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guardkit, "MIN_PYTHON", (99, 0))  # no python3 qualifies
    hook = guardkit.install(tmp_path / "guard", str(stub_modprobe))
    proc = subprocess.run(
        [hook, "remove", "igb"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0
    assert _calls(stub_modprobe) == ["-r --ignore-remove igb"]
    assert proc.stderr.strip() == (
        "rdmad-guard: cannot judge 'modprobe -r igb' (no python3 >= 99.0 on this host); "
        "unloading unguarded"
    )


def test_with_the_copy_gone_it_lets_the_unload_go_ahead(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    hook = guardkit.install(tmp_path / "guard", str(stub_modprobe))
    for kit in (tmp_path / "guard").glob("rdmad-*"):
        shutil.rmtree(kit)
    proc = subprocess.run(
        [hook, "remove", "mlx5_core"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0
    assert _calls(stub_modprobe) == ["-r --ignore-remove mlx5_core"]


def test_a_hook_line_whose_program_is_gone_unloads_unguarded(
    tmp_path: Path, stub_modprobe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The modprobe.d line itself: the package (or the host copy) removed under a stale
    file must not make every `modprobe -r` of the module fail."""
    monkeypatch.setattr(guardhook, "MODPROBE", str(stub_modprobe))
    gone = tmp_path / "gone" / "hook"
    line = guardhook.render(["igb"], str(gone)).splitlines()[-1]
    assert line.startswith("remove igb ")
    command = line.split(" ", 2)[2]
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert proc.returncode == 0
    assert _calls(stub_modprobe) == ["-r --ignore-remove igb"]


def test_the_hook_line_runs_the_guard_when_it_is_there(tmp_path: Path) -> None:
    """The line's exit status is the guard's: a refusal (here a stub that refuses) stays
    a refusal, never falls through to the unguarded unload."""
    guard = tmp_path / "guard"
    guard.write_text('#!/bin/sh\necho refused "$@" >&2\nexit 1\n')
    guard.chmod(0o755)
    command = guardhook.render(["igb"], str(guard)).splitlines()[-1].split(" ", 2)[2]
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "refused remove igb"


def test_a_new_rdmad_makes_a_new_copy_and_removes_the_old(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    package = tmp_path / "pkg" / "rdmad"
    shutil.copytree(guardkit.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    base = tmp_path / "guard"
    guardkit.install(base, str(stub_modprobe), package)
    first = {p.name for p in base.glob("rdmad-*")}
    guardkit.install(base, str(stub_modprobe), package)  # the same rdmad: kept as it is
    assert {p.name for p in base.glob("rdmad-*")} == first
    (package / "text.py").write_text((package / "text.py").read_text() + "\n# changed\n")
    hook = guardkit.install(base, str(stub_modprobe), package)
    second = {p.name for p in base.glob("rdmad-*")}
    assert len(second) == 1 and second != first
    assert f"kit={base / next(iter(second))}" in Path(hook).read_text()
    assert not list(base.glob(".*.tmp"))


# --- nothing in the kit's directory is trusted as found (issue #59) ----------------------------


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_directory_others_can_write_is_refused_naming_it(
    tmp_path: Path, stub_modprobe: Path, mode: int
) -> None:
    base = tmp_path / "guard"
    base.mkdir()
    base.chmod(mode)
    with pytest.raises(guardkit.UnsafeKit, match=rf"{base} is writable by its group or by all"):
        guardkit.install(base, str(stub_modprobe))
    assert list(base.iterdir()) == []  # nothing written


def test_a_parent_others_own_or_can_write_is_refused(tmp_path: Path, stub_modprobe: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    parent = tmp_path / "shared"
    base = parent / "guard"
    base.mkdir(parents=True)
    os.chown(parent, 65534, 65534)  # nobody's: nobody could swap guard/ for their own
    with pytest.raises(guardkit.UnsafeKit, match=rf"{parent} belongs to uid 65534, not root"):
        guardkit.install(base, str(stub_modprobe))
    os.chown(parent, 0, 0)
    parent.chmod(0o1777)  # sticky, like /tmp: others cannot replace guard/
    guardkit.install(base, str(stub_modprobe))
    parent.chmod(0o777)  # not sticky: they could
    with pytest.raises(guardkit.UnsafeKit, match=rf"{parent} is writable"):
        guardkit.install(base, str(stub_modprobe))


def _kit(base: Path) -> Path:
    [kit] = base.glob("rdmad-*")
    return kit


def test_a_changed_or_damaged_copy_is_made_again_at_start(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    base = tmp_path / "guard"
    guardkit.install(base, str(stub_modprobe))
    kit = _kit(base)
    decide = kit / "rdmad" / "guard" / "decide.py"
    good = decide.read_text()
    decide.write_text("raise SystemExit(0)  # allow everything\n")
    (kit / "rdmad" / "text.py").unlink()
    guardkit.install(base, str(stub_modprobe))
    assert _kit(base) == kit
    assert decide.read_text() == good
    assert (kit / "rdmad" / "text.py").is_file()
    (kit / "guard.py").write_text("import os; os.system('touch /tmp/owned')\n")
    guardkit.install(base, str(stub_modprobe))
    assert (kit / "guard.py").read_text() == guardkit.ENTRY


def test_a_symlink_in_place_of_the_copy_is_not_followed(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    base = tmp_path / "guard"
    base.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    (base / guardkit.kit_name()).symlink_to(elsewhere)
    guardkit.install(base, str(stub_modprobe))
    kit = base / guardkit.kit_name()
    assert kit.is_dir() and not kit.is_symlink()
    assert [p.name for p in elsewhere.iterdir()] == ["keep"]  # untouched


def test_a_copy_broken_after_the_start_lets_the_unload_go_ahead_saying_so(
    tmp_path: Path, stub_modprobe: Path
) -> None:
    if shutil.which("python3") is None:
        pytest.skip("no python3 on this machine's PATH")  # Debian always has one
    hook = guardkit.install(tmp_path / "guard", str(stub_modprobe))
    (_kit(tmp_path / "guard") / "rdmad" / "text.py").unlink()  # a module deleted meanwhile
    proc = subprocess.run(
        [hook, "remove", "igb"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "its copy is broken (ModuleNotFoundError" in proc.stderr
    assert _calls(stub_modprobe) == ["-r --ignore-remove igb"]


def test_the_file_a_hook_line_tests_is_the_one_its_command_needs() -> None:
    assert guardhook.needed_file("/usr/lib/rdmad/bin/python3 -I -m rdmad.guard") == (
        "/usr/lib/rdmad/bin/python3"
    )
    assert guardhook.needed_file(guardkit.hook_command("/var/lib/rdmad/guard/hook")) == (
        "/var/lib/rdmad/guard/hook"
    )


def test_a_kit_on_a_noexec_mount_still_judges(tmp_path: Path, stub_modprobe: Path) -> None:
    """The hook script without its exec bit (what `noexec` makes of it): the line runs it
    through /bin/sh, so the guard judges instead of every `modprobe -r` failing with 126."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on this machine's PATH")  # Debian always has one
    hook = guardkit.install(tmp_path / "guard", str(stub_modprobe))
    Path(hook).chmod(0o644)
    line = guardhook.render(["rdmadnosuch0"], guardkit.hook_command(hook)).splitlines()[-1]
    proc = subprocess.run(
        ["sh", "-c", line.split(" ", 2)[2]], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode != 126 and "Permission denied" not in proc.stderr, proc.stderr
    # The guard judged (nothing of that name is loaded: allowed) and ran the unload,
    # whose own answer this is; this machine has no such module.
    assert proc.stderr == "modprobe: FATAL: Module rdmadnosuch0 not found.\n", proc.stderr

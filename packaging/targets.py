"""The package targets of packaging/targets.toml, for the build scripts.

    python3 packaging/targets.py list [deb|rpm]    # the target names, one per line
    python3 packaging/targets.py show TARGET ARCH  # shell assignments for `eval`

ARCH is amd64/x86_64 or arm64/aarch64 (either spelling); ``show`` prints both the
Debian and the RPM name of it, and the platform uv installs wheels for. Runs on the
build machine's python3 (3.11+: tomllib).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import tomllib

TARGETS = Path(__file__).with_name("targets.toml")
ARCHES = {  # either name -> (deb, rpm/uname)
    "amd64": ("amd64", "x86_64"),
    "x86_64": ("amd64", "x86_64"),
    "arm64": ("arm64", "aarch64"),
    "aarch64": ("arm64", "aarch64"),
}
# The newest manylinux level the pinned uv (build-requirements.lock) accepts for
# --python-platform. A newer glibc (Debian 13: 2.41) is clamped to it: that only leaves
# out wheels that need a C library newer than 2.40, and the lock has none.
UV_NEWEST_GLIBC = (2, 40)
FIELDS = ("format", "release", "python", "interpreter", "requires", "glibc", "proof")


def load() -> dict[str, dict[str, str]]:
    with TARGETS.open("rb") as f:
        targets: dict[str, dict[str, str]] = tomllib.load(f)
    for name, t in targets.items():
        missing = [k for k in FIELDS if k not in t]
        if missing or t["format"] not in ("deb", "rpm"):
            raise SystemExit(f"targets.toml: [{name}] lacks {missing} or has a bad format")
    return targets


def main(argv: list[str]) -> int:
    targets = load()
    if argv[:1] == ["list"]:
        for name, t in targets.items():
            if len(argv) < 2 or t["format"] == argv[1]:
                print(name)
        return 0
    if argv[:1] == ["show"] and len(argv) == 3:
        name, arch = argv[1], argv[2]
        if name not in targets or arch not in ARCHES:
            print(f"targets.py: unknown target {name!r} or arch {arch!r}", file=sys.stderr)
            print(f"  targets: {' '.join(targets)}; arches: amd64 arm64", file=sys.stderr)
            return 2
        t = targets[name]
        deb_arch, rpm_arch = ARCHES[arch]
        major, minor = min(tuple(map(int, t["glibc"].split("."))), UV_NEWEST_GLIBC)
        glibc = f"{major}_{minor}"
        values = {
            **{f"t_{k}": t[k] for k in FIELDS},
            "t_name": name,
            "t_deb_arch": deb_arch,
            "t_rpm_arch": rpm_arch,
            "t_platform": f"{rpm_arch}-manylinux_{glibc}",
        }
        for key, value in values.items():
            print(f"{key}={shlex.quote(value)}")
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

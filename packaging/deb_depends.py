"""The .deb's ``rdmad:Depends`` substitution for one target (debian/rules).

    python3 packaging/deb_depends.py TARGET DESTDIR    # prints rdmad:Depends=...

The release's interpreter (packaging/targets.toml ``requires``) and ``libc6`` at the
newest glibc any bundled wheel's manylinux tag names: the extension modules are
PyPI's, built against that floor, so their tags say what they need (dpkg-shlibdeps
would read them with the build machine's libc, and has none for a foreign
architecture). Runs on the build machine's python3 (3.11+).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from targets import load


def glibc_floor(site: Path) -> tuple[int, int] | None:
    """The newest ``manylinux_X_Y`` (or its legacy alias) of the installed wheels."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    floors = []
    for wheel in site.glob("*.dist-info/WHEEL"):
        tags = [
            ln.split(":", 1)[1].strip()
            for ln in wheel.read_text().splitlines()
            if ln.startswith("Tag:")
        ]
        levels = []
        for tag in tags:
            for plat in tag.split("-")[-1].split("."):
                if m := re.match(r"manylinux_(\d+)_(\d+)_", plat):
                    levels.append((int(m[1]), int(m[2])))
                elif (name := plat.rsplit("_", 1)[0]) in legacy:
                    levels.append(legacy[name])
        if levels:  # a wheel with several tags runs on the oldest of them
            floors.append(min(levels))
    return max(floors) if floors else None


def main(argv: list[str]) -> int:
    target = load()[argv[0]]
    site = next(Path(argv[1], "usr/lib/rdmad/lib").glob("python3.*/site-packages"))
    depends = [target["requires"]]
    if (floor := glibc_floor(site)) is not None:
        depends.append(f"libc6 (>= {floor[0]}.{floor[1]})")
    print("rdmad:Depends=" + ", ".join(depends))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

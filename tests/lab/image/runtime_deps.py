"""Print rdmad's runtime dependencies ([project].dependencies), one per line.

Read at image-build time so the guest venv follows pyproject.toml and the
list is part of the image cache key.
"""

import sys
from pathlib import Path

import tomllib


def main() -> None:
    pyproject = Path(sys.argv[1])
    with pyproject.open("rb") as f:
        deps = tomllib.load(f).get("project", {}).get("dependencies", [])
    for dep in deps:
        print(dep)


if __name__ == "__main__":
    main()

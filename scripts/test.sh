#!/usr/bin/env bash
# Set up and run every check and test: lint, types, layer contracts, unit, kernel
# (netns, as root), the packages (.deb, .rpm: built, then checked), and the QEMU lab
# (as root; builds the guest image once, cached; installs rdmad from the .deb).
# RDMAD_SKIP_LAB=1 leaves the lab out (its tests then skip, saying why; under .ci/run,
# RDMAD_TESTS_REQUIRED=1, or any truthy CI they fail).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
py=.venv/bin

echo "== ruff"; $py/ruff check rdmad tests bench packaging
echo "== ruff format"; $py/ruff format --check rdmad tests bench packaging
echo "== mypy (strict on model, config, reconcile)"; $py/mypy rdmad
echo "== import contracts"; $py/lint-imports

if [[ $(id -u) -eq 0 && ${RDMAD_SKIP_LAB:-0} != 1 ]]; then
    echo "== lab: host packages and guest image"
    bash scripts/lab-deps.sh
    bash scripts/lab-image.sh
fi
# With RDMAD_TESTS_REQUIRED=1 (.ci/run exports it) or any truthy CI, a test that skips
# fails the run instead: tests/support/required.py decides that from the environment,
# for any user and any way pytest is started.

if [[ $(id -u) -eq 0 ]]; then
    bash scripts/pkg-deps.sh
fi
# promtool needs root to install; as another user fleet-deps says so and the deploy
# tests skip (locally) or fail (CI) on the missing tool.
bash scripts/fleet-deps.sh || true
if command -v dpkg-buildpackage >/dev/null && command -v rpmbuild >/dev/null; then
    # Built once here; tests/packaging and the lab (which installs the .deb) reuse
    # them from dist/cache/ (keyed by a hash of the inputs).
    echo "== packages: .deb and .rpm"
    bash scripts/build-deb.sh
    bash scripts/build-rpm.sh
fi

echo "== pytest"
$py/python -m pytest "$@"

# Every benchmark once at its smallest size: errors fail the run, numbers never do.
# (`make bench-quick` runs the same; make itself need not be installed here.)
echo "== bench-quick"
$py/python bench/run.py --quick

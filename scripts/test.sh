#!/usr/bin/env bash
# Set up and run every check and test: lint, types, layer contracts, unit, kernel
# (netns, as root), the packages (.deb, .rpm: built, then checked), and the QEMU lab
# (as root; builds the guest image once, cached; installs rdmad from the .deb).
# RDMAD_SKIP_LAB=1 leaves the lab out (its tests then skip, saying why; under .ci/run,
# RDMAD_TESTS_REQUIRED=1, or any truthy CI they fail).
#
# Without arguments pytest runs twice: every test but the lab's, then the lab with
# RDMAD_LAB_WORKERS guests at once (pytest-xdist; default 2, 1 for one guest at a time:
# tests/lab/workers.py). Arguments go to one pytest run over what they select.
# Each phase's time is printed at the end, also when one fails (CI's time budget).
set -euo pipefail
cd "$(dirname "$0")/.."

PHASES=()
phase() {  # phase NAME COMMAND...: run it, and remember how long it took
    local name=$1 start=$SECONDS rc=0
    shift
    "$@" || rc=$?
    PHASES+=("$(printf '%-34s %5d s%s' "$name" $((SECONDS - start)) "$([[ $rc -eq 0 ]] || echo "  (exit $rc)")")")
    return $rc
}
report() {
    echo "== where the time went"
    local line
    for line in "${PHASES[@]}"; do echo "  $line"; done
    printf '  %-34s %5d s\n' total "$SECONDS"
}
trap report EXIT

phase setup bash scripts/setup.sh
py=.venv/bin

echo "== ruff"; phase ruff $py/ruff check rdmad tests bench packaging
echo "== ruff format"; phase "ruff format" $py/ruff format --check rdmad tests bench packaging
echo "== mypy (strict on model, config, reconcile)"; phase mypy $py/mypy rdmad
echo "== import contracts"; phase "import contracts" $py/lint-imports

if [[ $(id -u) -eq 0 && ${RDMAD_SKIP_LAB:-0} != 1 ]]; then
    echo "== lab: host packages and guest image"
    phase "lab: host packages" bash scripts/lab-deps.sh
    phase "lab: guest image" bash scripts/lab-image.sh
fi
# With RDMAD_TESTS_REQUIRED=1 (.ci/run exports it) or any truthy CI, a test that skips
# fails the run instead: tests/support/required.py decides that from the environment,
# for any user and any way pytest is started.

if [[ $(id -u) -eq 0 ]]; then
    phase "packaging tools" bash scripts/pkg-deps.sh
fi
# promtool needs root to install; as another user fleet-deps says so and the deploy
# tests skip (locally) or fail (CI) on the missing tool.
phase "fleet tools" bash scripts/fleet-deps.sh || true
if command -v dpkg-buildpackage >/dev/null && command -v rpmbuild >/dev/null; then
    # Built once here; tests/packaging and the lab (which installs the .deb) reuse
    # them from dist/cache/ (keyed by a hash of the inputs).
    echo "== packages: .deb and .rpm"
    phase "packages: .deb" bash scripts/build-deb.sh
    # The lab's package test upgrades to a second version: built here, not in the test.
    phase "packages: upgrade .deb" bash scripts/build-deb.sh --version-suffix +lab1
    phase "packages: .rpm" bash scripts/build-rpm.sh
fi

# pytest's 25 slowest tests close each run (CI's time budget, visible in every log).
if [[ $# -gt 0 ]]; then
    echo "== pytest $*"
    phase pytest $py/python -m pytest --durations=25 "$@"
else
    echo "== pytest: everything but the lab"
    phase "pytest: all but the lab" $py/python -m pytest --durations=25 -m "not lab"
    workers=${RDMAD_LAB_WORKERS:-2}
    echo "== pytest: the lab, $workers guests at once"
    phase "pytest: the lab ($workers workers)" \
        $py/python -m pytest --durations=25 -m lab -n "$workers" --maxschedchunk=1 tests/lab
fi

# Every benchmark once at its smallest size: errors fail the run, numbers never do.
# (`make bench-quick` runs the same; make itself need not be installed here.)
echo "== bench-quick"
phase bench-quick $py/python bench/run.py --quick

.PHONY: test demo lint lab-shell lab-image bench bench-quick deb rpm packages lock soak test-pythons test-arm64 test-debian13 test-debian13-lab
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
lint:
	bash scripts/setup.sh && .venv/bin/ruff check rdmad tests bench packaging && .venv/bin/mypy rdmad && .venv/bin/lint-imports
# Every bench/bench_*.py: one table of ratios to the baselines, and bench/results.json;
# then bench/RESULTS.md's table from that JSON (benches that did not run keep their row),
# also when a bench failed (the run's exit status stays the result).
# bench-quick runs each once at its smallest size (CI): it fails on errors, never on timings,
# and leaves RESULTS.md alone.
bench:
	bash scripts/setup.sh && { .venv/bin/python bench/run.py; rc=$$?; \
	  .venv/bin/python bench/results_table.py && exit $$rc; }
bench-quick:
	bash scripts/setup.sh && .venv/bin/python bench/run.py --quick
# The lab soak (root, QEMU; not in CI): make soak SOAK_MINUTES=30; the last result in
# tests/soak-result.json.
SOAK_MINUTES ?= 30
soak:
	bash scripts/setup.sh && .venv/bin/python tests/lab/soak.py --minutes $(SOAK_MINUTES)
lab-image:
	bash scripts/lab-deps.sh && bash scripts/lab-image.sh
lab-shell:
	bash scripts/lab-shell.sh
# Packages into dist/ (git-ignored), each cached by a hash of its inputs.
deb:
	bash scripts/pkg-deps.sh && bash scripts/build-deb.sh
rpm:
	bash scripts/pkg-deps.sh && bash scripts/build-rpm.sh
# Every release of packaging/targets.toml for amd64 and arm64, and a table of them.
packages:
	bash scripts/pkg-deps.sh && bash scripts/build-packages.sh
# The unit, ctl and API suites on Debian 13's Python 3.13 too (root; a trixie root made
# with debootstrap, cached; not in CI). The last result is in README.md.
test-pythons:
	bash scripts/test-pythons.sh
# The arm64 .deb in an arm64 Debian 12 root under qemu-user; the Debian 13 .deb in a
# Debian 13 root (root; debootstrap, cached; not in CI). Last results in README.md.
test-arm64:
	bash scripts/pkg-deps.sh && bash scripts/test-package-root.sh arm64
test-debian13:
	bash scripts/pkg-deps.sh && bash scripts/test-package-root.sh debian13
# The Debian 13 .deb in a Debian 13 lab guest (QEMU, trixie's kernel): installed
# offline, VFs + settings + rxe restored after a reboot and a PF reload, rdma_cm
# traffic (root; its own image, cached; not in CI). Last result in README.md.
test-debian13-lab:
	bash scripts/test-debian13-lab.sh
# Re-pin packaging/requirements.lock after a change to pyproject's dependencies.
lock:
	bash packaging/lock.sh

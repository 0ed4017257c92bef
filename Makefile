.PHONY: test demo lint lab-shell lab-image bench
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
lint:
	bash scripts/setup.sh && .venv/bin/ruff check rdmad tests bench && .venv/bin/mypy rdmad && .venv/bin/lint-imports
lab-image:
	bash scripts/lab-deps.sh && bash scripts/lab-image.sh
lab-shell:
	bash scripts/lab-shell.sh

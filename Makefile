# The two commands of the README are `make tour` and `make test`; both install what is missing first.
.PHONY: install tour test docs export lab lint clean-nbs

install:
	@bash tools/bootstrap.sh

tour:
	@bash tools/bootstrap.sh
	@.venv/bin/nac-lab tour

test:
	@bash tools/bootstrap.sh --test
	@bash tools/test.sh

docs: install
	@.venv/bin/nac-lab docs

export: install
	@.venv/bin/nbdev_export && .venv/bin/nbdev_clean && .venv/bin/nac-lab docs --readme-only

# JupyterLab refuses to start as root unless told (--allow-root): containers and these machines run as root. It prints the
# URL with its token once it is up.
lab: install
	@echo "JupyterLab on http://127.0.0.1:8888/lab (the notebooks in nbs/; Ctrl-C stops it; the URL with its token follows)"
	@.venv/bin/jupyter lab --no-browser --ip=127.0.0.1 --port=8888 --notebook-dir=nbs $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: install
	@.venv/bin/ruff check nac_lab tests conftest.py tools

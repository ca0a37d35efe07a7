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

# JupyterLab on the checkout, opened on nbs/; tools/lab.sh adds --allow-root only for root and prints the URL and
# token first (PORT=8889 make lab for another port).
lab: install
	@bash tools/lab.sh

lint: install
	@.venv/bin/ruff check nac_lab tests conftest.py tools

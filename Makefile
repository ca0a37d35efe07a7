# The two commands of the README are `make tour` and `make test`; both install what is missing first.
.PHONY: install tour test docs export clean-nbs

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

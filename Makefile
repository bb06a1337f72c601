# The two commands a newcomer needs: `make demo` and `make test`.
# Both set up first (as root; idempotent, seconds when already done).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-unit bench fuzz clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/pslat demo

test: setup
	$(PY) -m pytest -ra --durations=40 tests

test-unit: setup
	$(PY) -m pytest -ra tests/unit

bench: setup
	$(PY) -m bench

# every fuzz target coverage-guided (atheris): FUZZ_ARGS="--seconds 60 pslite_stream"
fuzz: setup
	$(PY) -m fuzz $(FUZZ_ARGS)

clean:
	-$(VENV)/bin/pslat cluster down
	rm -rf $(VENV) .venv-mxnet .venv-paddle .venv-torch .byteps
	$(MAKE) -C workloads/cluster clean

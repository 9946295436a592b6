# The two commands a newcomer runs: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in .venv/ and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: demo test build bench clean

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 is pinned here (not in pyproject) because this exact CPU build is on this machine's disk;
	# an unpinned torch would pull several GB of CUDA wheels.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,tune]'
	touch $(INSTALLED)

build: $(INSTALLED)
	$(PY) build.py --target cpu

demo: build
	$(VENV)/bin/nki-ops demo

test: build
	$(PY) -m pytest

bench: build
	$(VENV)/bin/nki-ops bench giou

clean:
	rm -rf build .nki-ops benchmarks/results

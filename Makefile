# The two commands a newcomer runs: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in .venv/ and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: demo test build bench clean postgresql

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 is pinned here (not in pyproject) because this exact CPU build is on this machine's disk;
	# an unpinned torch would pull several GB of CUDA wheels.
	$(PY) -m pip install --quiet --no-compile torch==2.13.0 'setuptools>=64'
	# setuptools is pyproject's build requirement: the editable install builds with this one, where an isolated
	# build would install it again into a temporary environment (a few seconds).
	$(PY) -m pip install --quiet --no-compile --no-build-isolation -e '.[dev,tune]'
	# The bytecode pip would have written file by file (most of torch's install time), on every CPU; quiet=2: like
	# pip, without a word for the few files of torch's that only a newer Python parses.
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
	touch $(INSTALLED)

# --target auto: the CPU build here, the GpSimd build on a Neuron host.
build: $(INSTALLED)
	$(PY) build.py --target auto

demo: build
	$(VENV)/bin/nki-ops demo

# One pytest worker per CPU (pytest-xdist); the C++ tests, which share build/tests, stay on one worker.
test: build postgresql
	$(PY) -m pytest -n auto --dist loadgroup

# The tuner's multi-worker test starts its own PostgreSQL server: install the Debian server package when missing.
postgresql:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends postgresql; }

bench: build
	$(VENV)/bin/nki-ops bench giou

clean:
	rm -rf build .nki-ops benchmarks/results

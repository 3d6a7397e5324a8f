# Two commands for a newcomer:  make lab   (install + open JupyterLab)
#                               make test  (install + unit tests + every notebook run by nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lab lint test test-fast test-grader test-emulated test-compat clean strip

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch as constraints.txt pins it (the package accepts a range): the CPU build here, the CUDA
	# build from PyPI on a GPU machine
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[lab,test]"
	touch $(STAMP)

install: $(STAMP)

# Jupyter refuses to start as root without --allow-root (containers, cloud VMs): add it only then
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: install
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/

# pytest on every core (pytest-xdist; a file per worker, so a notebook runs in one kernel; one torch
# thread per worker); JOBS=1 runs in one process
JOBS ?= auto
XDIST = $(if $(filter 1,$(JOBS)),-p no:xdist,-n $(JOBS) --dist loadfile)

# ruff (rules in pyproject.toml) and notebooks committed without outputs
lint: install
	$(BIN)/ruff check .
	$(BIN)/python tools/check_stripped.py

# the whole suite: lint, unit tests and every notebook in notebooks/ (pyproject.toml's pytest
# settings); about 6 minutes on 2 cores
test: lint
	$(BIN)/python -m pytest -q $(XDIST)

# the grader end to end: a class of cheating submissions, real nbgrader, and every solution notebook
# executed top to bottom (its check_* cells grade it in the kernel) (14 min of CPU time, more wall time on a loaded machine)
test-grader: install
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[grading]"
	$(BIN)/python -m pytest -q -m grader tests
	$(BIN)/python -m pytest -q $(XDIST) solutions

# what a GPU computes differently, on the CPU (about 1-2 minutes): the tests marked `emulated` (the
# autocast emulation against the real AutocastCUDA kernels on fake CUDA tensors, exercise 08 and
# notebook 09's tolerances on TF32 ranks and in other summation orders), then notebooks 08 and 09
# and exercise 08's solution with their parallel ranks computing as TF32 GPUs would
# (COURSE_EMULATE_TF32=1): their GPU-vs-reference asserts must hold on a recent GPU too
# (two runs: a notebook has no `emulated` mark, so `-m emulated` would deselect it)
test-emulated: install
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m emulated tests
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m "not grader" notebooks/08_data_parallel.ipynb \
		notebooks/09_model_parallel.ipynb solutions/08_data_parallel.ipynb

# the course on another torch, as a CUDA machine with its own torch runs it (tools/test_compat.sh):
#   make test-compat TORCH=2.11.0   (the GPU machines' torch)    make test-compat TORCH=2.15.0
# a venv of its own (.venv-torch-VERSION, Python 3.12), the course from the checkout, the GPU
# kit's dry run and the whole test suite; not in CI (a CUDA build of torch is ~3 GB to download)
TORCH ?= 2.11.0
COMPAT_PYTHON ?= python3.12
test-compat:
	tools/test_compat.sh $(TORCH) $(COMPAT_PYTHON)

# unit tests only, no notebooks
test-fast: install
	$(BIN)/python -m pytest -q $(XDIST) tests

# remove outputs from every notebook before committing
strip: install
	$(BIN)/jupyter nbconvert --clear-output --inplace $$(git ls-files '*.ipynb' | grep -v '^docs/gpu-runs/')

clean:
	rm -rf $(VENV) .venv-torch-* .pytest_cache

# --- the course as a website (site/): make site, then make site-check
.PHONY: site site-check
SITE_STAMP := $(VENV)/.site-installed

$(SITE_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[site]"
	touch $(SITE_STAMP)

# static HTML of the whole course in build/site/: every notebook executed at the tiny preset on
# this machine (executed copies cached in build/site-cache/), exercises, teaching notes, search
site: $(SITE_STAMP)
	$(BIN)/python site/build.py --preset tiny

# every page of build/site in headless Chromium (Debian: apt-get install chromium chromium-driver):
# fails on an external request, a broken link or image, a console error or a cell error output;
# screenshots in build/site-check/. First the check's own tests (it must catch each defect).
site-check: $(SITE_STAMP)
	$(BIN)/python -m pytest -q site/tests
	$(BIN)/python site/check.py

# --- mutation check (slow, not part of make test): hand-written bugs planted one at a time in a
# copy of the repository; the unit tests must catch each. Survivors are listed and fail the
# target. MUTATE picks the course_utils modules, MUTATION_ARGS adds options (see tools/mutants.py)
.PHONY: mutation
MUTATE ?= memory unet config inplace_abn parallel allocator amp_rules train explorer numerics
MUTATION_ARGS ?=
mutation: install
	$(BIN)/python tools/mutants.py $(MUTATE) $(MUTATION_ARGS)

# --- a new notebook with its exercise, from course_utils/templates/ (CONTRIBUTING.md):
#   make new-notebook NN=11 TITLE="Activation offloading"
.PHONY: new-notebook
new-notebook: install
	$(BIN)/python -m course_utils.scaffold $(NN) "$(TITLE)"

# the scaffold end to end: the next notebook, scaffolded in a copy of the repository, passes the tests
# with no other edit (about a minute; tests/test_scaffold.py)
.PHONY: test-scaffold
# FULL=1: the whole make test suite on the scaffolded copy (about 8 minutes)
test-scaffold: install
	$(if $(filter 1,$(FULL)),COURSE_SCAFFOLD_FULL_SUITE=1 )$(BIN)/python -m pytest -q -m scaffold tests/test_scaffold.py

# Two commands for a newcomer:  make lab   (install + open JupyterLab)
#                               make test  (install + unit tests + every notebook run by nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lab test test-fast test-grader test-emulated test-compat clean strip

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

# the whole suite: unit tests and every notebook in notebooks/ (see pytest settings in pyproject.toml)
test: install
	$(BIN)/python -m pytest -q

# the grader end to end: a class of cheating submissions, and real nbgrader (about 10 minutes)
test-grader: install
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[grading]"
	$(BIN)/python -m pytest -q -m grader tests

# what a GPU computes differently, on the CPU (about 3 minutes): the tests marked `emulated` (the
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
	$(BIN)/python -m pytest -q tests

# remove outputs from every notebook before committing
strip: install
	$(BIN)/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb

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

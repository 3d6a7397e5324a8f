# Two commands for a newcomer:  make lab   (install + open JupyterLab)
#                               make test  (install + unit tests + every notebook run by nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lab test test-fast test-grader clean strip

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch pinned first: the CPU build here, the CUDA build from PyPI on a GPU machine
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[lab,test]"
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
	$(BIN)/python -m pip install -q -e ".[grading]"
	$(BIN)/python -m pytest -q -m grader tests

# unit tests only, no notebooks
test-fast: install
	$(BIN)/python -m pytest -q tests

# remove outputs from every notebook before committing
strip: install
	$(BIN)/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache

# --- the course as a website (site/): make site, then make site-check
.PHONY: site site-check
SITE_STAMP := $(VENV)/.site-installed

$(SITE_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e ".[site]"
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
MUTATE ?= memory unet config inplace_abn parallel allocator amp_rules train explorer
MUTATION_ARGS ?=
mutation: install
	$(BIN)/python tools/mutants.py $(MUTATE) $(MUTATION_ARGS)

# `make` or `make help` lists every target; a newcomer needs two: make lab (JupyterLab), make test (every test)
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# extra pip flags for every install (CI: --no-compile; CONTRIBUTING.md, "The Makefile")
INSTALL_FLAGS ?=

.PHONY: help install lab lint test test-ci test-fast test-grader test-sweep test-emulated test-compat test-hosted dist clean strip

help: ## list every target, one line each (the default goal)
	@echo "make TARGET, run in the checkout (CONTRIBUTING.md says more):"
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch as constraints.txt pins it (the package accepts a range): CPU build here, CUDA build on a GPU machine
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt torch
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[lab,test]"
	touch $(STAMP)

install: $(STAMP) ## .venv with torch, the course and its test tools (every other target needs it)

# nbgrader and the grader's other extras (make test-ci, test-grader, test-sweep)
GRADING_STAMP := $(VENV)/.grading-installed
$(GRADING_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[grading]"
	touch $(GRADING_STAMP)

# Jupyter refuses to start as root without --allow-root (containers, cloud VMs): add it only then
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

# rooted at the repository so that every notebook's relative link resolves (tests/test_lab_links.py reads it)
LAB_ROOT := $(CURDIR)
LAB_OPEN := notebooks
lab: install ## JupyterLab at the repository, opened in notebooks/
	$(BIN)/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=$(LAB_ROOT) --LabApp.default_url=/lab/tree/$(LAB_OPEN)

# pytest on every core (pytest-xdist, a file per worker: a notebook runs in one kernel); JOBS=1: one process
JOBS ?= auto
XDIST = $(if $(filter 1,$(JOBS)),-p no:xdist,-n $(JOBS) --dist loadfile)

lint: install ## ruff (rules in pyproject.toml) and notebooks without outputs (tracked and new ones)
	$(BIN)/ruff check .
	$(BIN)/python tools/check_stripped.py

# make test's and test-ci's pytest fails if a process, /dev/shm file or temporary file outlives it
NO_LEFTOVERS = $(BIN)/python tools/no_leftovers.py --strict-temp --

test: lint ## lint, unit tests and every notebook under nbval (about 6 min on 2 cores)
	$(NO_LEFTOVERS) $(BIN)/python -m pytest -q $(XDIST)

CI_MARKS = not hosted and not sweep
test-ci: lint $(GRADING_STAMP) ## what CI runs (.ci/run): test, test-grader, test-emulated, test-scaffold in one session
	$(NO_LEFTOVERS) $(BIN)/python -m pytest -q $(XDIST) -m "$(CI_MARKS)" tests notebooks solutions/08_data_parallel.ipynb

test-grader: $(GRADING_STAMP) ## the grader's core end to end (in CI; marker grader, not sweep)
	$(BIN)/python -m pytest -q -m "grader and not sweep" tests

test-sweep: $(GRADING_STAMP) ## the grader's adversarial suite, exhaustive sweeps, property suites at 400 examples (not in CI; 60-70 min)
	$(BIN)/python -m pytest -q -m sweep tests
	HYPOTHESIS_PROFILE=sweep $(BIN)/python -m pytest -q $(XDIST) tests/test_properties_*.py

# two runs: a notebook has no `emulated` mark, so `-m emulated` would deselect it
test-emulated: install ## what a GPU computes differently, on the CPU (marker emulated; 1-2 min)
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m emulated tests
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m "not grader" solutions/08_data_parallel.ipynb

TORCH ?= 2.11.0
COMPAT_PYTHON ?= python3.12
test-compat: ## the course on another torch in .venv-torch-VERSION: make test-compat TORCH=2.11.0 (not in CI)
	tools/test_compat.sh $(TORCH) $(COMPAT_PYTHON)

dist: install ## dist/: course_utils' wheel and gpu-memory-course.zip for a hosted GPU notebook (docs/hosted-gpu.md)
	$(BIN)/python -m course_utils.hosted --dist dist

COMPAT_VENV ?= .venv-torch-2.11.0
test-hosted: dist ## make dist's wheel in fresh venvs that have a torch (not in CI; needs test-compat's venv)
	COURSE_COMPAT_VENV=$(abspath $(COMPAT_VENV)) $(BIN)/python -m pytest -q -p no:xdist -m hosted tests/test_hosted_install.py

test-fast: install ## unit tests only, no notebooks
	$(BIN)/python -m pytest -q $(XDIST) tests

strip: install ## remove the outputs of every notebook that has some, tracked or new (tools/check_stripped.py)
	@dirty="$$($(BIN)/python tools/check_stripped.py --dirty)"; if [ -n "$$dirty" ]; then set -x; $(BIN)/jupyter nbconvert --clear-output --inplace $$dirty; else echo "every notebook is stripped"; fi

clean: ## remove .venv, the compat venvs and pytest's cache
	rm -rf $(VENV) .venv-torch-* .pytest_cache

# --- the course as a website (site/): make site, then make site-check
.PHONY: site site-check
SITE_STAMP := $(VENV)/.site-installed

$(SITE_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[site]"
	touch $(SITE_STAMP)

site: $(SITE_STAMP) ## the course as static HTML in build/site/ (SITE_ARGS="--only 04,10" or "--fresh")
	$(BIN)/python site/build.py --preset tiny $(SITE_ARGS)

site-check: $(SITE_STAMP) ## the site check's own tests, then every page of build/site in headless Chromium
	$(BIN)/python -m pytest -q site/tests
	$(BIN)/python site/check.py

# --- mutation check (slow, not in make test; tools/mutants.py)
.PHONY: mutation
MUTATE ?= memory unet config inplace_abn parallel allocator amp_rules train explorer budget numerics gpu_kit
MUTATION_ARGS ?=
mutation: install ## plant hand-written bugs one at a time; the unit tests must catch each (MUTATE=memory ...)
	$(BIN)/python tools/mutants.py $(MUTATE) $(MUTATION_ARGS)

# --- a new notebook with its exercise (CONTRIBUTING.md, "Adding a notebook")
.PHONY: new-notebook check-notebook test-scaffold
new-notebook: install ## a new notebook from course_utils/templates/: make new-notebook NN=13 TITLE="Activation offloading"
	$(BIN)/python -m course_utils.scaffold $(NN) "$(TITLE)"

# the tests check-notebook runs beside notebook NN's own (tests/test_scaffold.py runs the same on a scaffolded copy)
CHECK_TESTS = tests/test_course_layout.py tests/test_check_cells.py tests/test_exercises.py tests/test_grading.py tests/test_readme.py
CHECK_K = course_layout or check_cells or every_exercise or three_parts or committed_exercises or nbgrader_metadata or release_has_no_answers or teaching_timings or readme_blocks
check-notebook: install ## scaffold --check, then the layout tests and notebook NN's: make check-notebook NN=13
	@test -n "$(NN)" || { echo "give the notebook's number: make check-notebook NN=13"; exit 2; }
	$(BIN)/python -m course_utils.scaffold --check
	$(BIN)/python -m pytest -q -p no:xdist -k "$(NN) or $(CHECK_K)" $(CHECK_TESTS) notebooks/$(NN)_*.ipynb solutions/$(NN)_*.ipynb

test-scaffold: install ## the next notebook scaffolded in a copy must pass its tests (in CI; FULL=1: all of make test)
	$(if $(filter 1,$(FULL)),COURSE_SCAFFOLD_FULL_SUITE=1 )$(BIN)/python -m pytest -q -m scaffold tests/test_scaffold.py

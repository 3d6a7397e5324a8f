# Two commands for a newcomer:  make lab   (install + open JupyterLab)
#                               make test  (install + unit tests + every notebook run by nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# extra pip flags for every install: CI passes --no-compile (.ci/run), leaving each module to be
# compiled when first imported instead of all of torch's and Jupyter's at install (92 -> 48 CPU-s)
INSTALL_FLAGS ?=

.PHONY: install lab lint test test-ci test-fast test-grader test-sweep test-emulated test-compat test-hosted dist clean strip

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch as constraints.txt pins it (the package accepts a range): the CPU build here, the CUDA
	# build from PyPI on a GPU machine
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt torch
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[lab,test]"
	touch $(STAMP)

install: $(STAMP)

# nbgrader and the grader's other extras, for the grader's tests (make test-ci, test-grader, test-sweep)
GRADING_STAMP := $(VENV)/.grading-installed
$(GRADING_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[grading]"
	touch $(GRADING_STAMP)

# Jupyter refuses to start as root without --allow-root (containers, cloud VMs): add it only then
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

# JupyterLab rooted at the repository, so that every relative link of a notebook resolves
# (../exercises/, ../README.md, ../docs/; tests/test_lab_links.py reads LAB_ROOT from here); it opens
# its file browser in notebooks/, and exercises/ is one click up in the breadcrumbs
LAB_ROOT := $(CURDIR)
LAB_OPEN := notebooks
lab: install
	$(BIN)/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=$(LAB_ROOT) --LabApp.default_url=/lab/tree/$(LAB_OPEN)

# pytest on every core (pytest-xdist; a file per worker, so a notebook runs in one kernel; one torch
# thread per worker); JOBS=1 runs in one process
JOBS ?= auto
XDIST = $(if $(filter 1,$(JOBS)),-p no:xdist,-n $(JOBS) --dist loadfile)

# ruff (rules in pyproject.toml) and notebooks committed without outputs
lint: install
	$(BIN)/ruff check .
	$(BIN)/python tools/check_stripped.py

# every pytest run of make test and make test-ci goes through tools/no_leftovers.py: it fails the run
# if a process, a /dev/shm file or a temporary file outlives it (and removes them; a folder it lists
# shows a few of its files, to tell whose it is)
NO_LEFTOVERS = $(BIN)/python tools/no_leftovers.py --strict-temp --

# the whole suite: lint, unit tests and every notebook in notebooks/ (pyproject.toml's pytest
# settings; notebooks 08 and 09 with their ranks computing as TF32 GPUs would, conftest.py);
# about 6 minutes on an idle 2-core machine
test: lint
	$(NO_LEFTOVERS) $(BIN)/python -m pytest -q $(XDIST)

# what CI runs (.ci/run): make test's suite, the grader's core (make test-grader), what a GPU computes
# differently (make test-emulated) and the scaffold (make test-scaffold) in one pytest session, so
# that torch, the test modules and the shared predictions (course_utils/session_cache.py) are
# loaded once per worker instead of once per target
CI_MARKS = not hosted and not sweep
test-ci: lint $(GRADING_STAMP)
	$(NO_LEFTOVERS) $(BIN)/python -m pytest -q $(XDIST) -m "$(CI_MARKS)" tests notebooks solutions/08_data_parallel.ipynb

# the grader's core end to end (CI): one class of 9 files (7 graded cheating, hostile and honest submissions) graded
# in parallel, the output limit on its own (four kernels at once, no exercise), the issue's forged observations on
# exercises 00 and 03, a grader killed mid-run,
# nbgrader generate_assignment (make test runs the student release's make check on exercise 00 and its
# solution; tests/test_exercises.py grades every part of every solution and every typical wrong
# answer). Each graded submission costs about 10 s of CPU (a kernel and a sandbox, each importing
# torch), and CI gets about 0.3 of a core (.ci/run): the rest of the adversarial suite is make test-sweep's
test-grader: $(GRADING_STAMP)
	$(BIN)/python -m pytest -q -m "grader and not sweep" tests

# the rest of the grader's adversarial suite and the exhaustive sweeps, not in CI (like make mutation;
# 55-65 min on a 2-core machine at load 15); run it before a release and after a change to
# course_utils/grading/: four more in-memory cheats and honest names alone, the make check of exercise
# 00's typical wrong answers, the hostile class graded one at a time (re-forking processes, planted links,
# deadlines, /dev/shm, floods of files), the grader without Landlock, course_utils' answers refused,
# parallel against sequential grading, real nbgrader autograde, the forgeries on every exercise; every
# solution's observation mutated every way (a list cut or padded, a key dropped, a tensor reshaped or
# cast, ...), each mutant failing its judge; every solution notebook executed top to bottom in a fresh
# kernel by the student release's `make check`, passing every part the release checks (`pytest
# solutions` runs the solutions under nbval, the same runs); seed 004's DenseNet test, whose every
# assert notebook 07 makes in make test
test-sweep: $(GRADING_STAMP)
	$(BIN)/python -m pytest -q -m sweep tests

# what a GPU computes differently, on the CPU (about 1-2 minutes): the tests marked `emulated` (the
# autocast emulation against the real AutocastCUDA kernels on fake CUDA tensors, exercise 08 and
# notebook 09's tolerances on TF32 ranks and in other summation orders), then exercise 08's solution
# with its parallel ranks computing as TF32 GPUs would (COURSE_EMULATE_TF32=1): its GPU-vs-reference
# asserts must hold on a recent GPU too. Notebooks 08 and 09 run so in make test (conftest.py)
# (two runs: a notebook has no `emulated` mark, so `-m emulated` would deselect it)
test-emulated: install
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m emulated tests
	COURSE_EMULATE_TF32=1 $(BIN)/python -m pytest -q -m "not grader" solutions/08_data_parallel.ipynb

# the course on another torch, as a CUDA machine with its own torch runs it (tools/test_compat.sh):
#   make test-compat TORCH=2.11.0   (the GPU machines' torch)    make test-compat TORCH=2.15.0
# a venv of its own (.venv-torch-VERSION, Python 3.12), the course from the checkout, the GPU
# kit's dry run and the whole test suite; not in CI (a CUDA build of torch is ~3 GB to download)
TORCH ?= 2.11.0
COMPAT_PYTHON ?= python3.12
test-compat:
	tools/test_compat.sh $(TORCH) $(COMPAT_PYTHON)

# the course for a hosted GPU notebook (Colab, Kaggle; docs/hosted-gpu.md): in dist/ a wheel of
# course_utils (torch as a range, not a pin) and gpu-memory-course.zip (notebooks, exercises, README,
# docs and the wheel) for a learner to upload
dist: install
	$(BIN)/python -m course_utils.hosted --dist dist

# the wheel of make dist installed into fresh venvs that already have a torch: torch 2.11 (the compat
# venv's CUDA build, linked in; Python 3.12) runs notebook 00 under nbval at COURSE_SIZE=tiny, and torch
# 2.13 from pip's index imports course_utils outside the checkout; torch must be unchanged after each.
# Not in CI (needs make test-compat's venv); COMPAT_VENV picks it. Measured time: docs/hosted-gpu.md
COMPAT_VENV ?= .venv-torch-2.11.0
test-hosted: dist
	COURSE_COMPAT_VENV=$(abspath $(COMPAT_VENV)) $(BIN)/python -m pytest -q -p no:xdist -m hosted tests/test_hosted_install.py

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
	$(BIN)/python -m pip install -q $(INSTALL_FLAGS) -c constraints.txt -e ".[site]"
	touch $(SITE_STAMP)

# static HTML of the whole course in build/site/: every notebook executed at the tiny preset on
# this machine, two kernels at a time (executed copies cached in build/site-cache/, each keyed on
# the course_utils modules its notebook uses), exercises, teaching notes, search; GPU figures from
# recorded/ where a GPU run was recorded. SITE_ARGS adds options, e.g. SITE_ARGS="--only 04,10"
# (a few pages, to work on the site) or "--fresh" (execute everything again).
# Measured on the shared 2-core machine at load 8-13 (2026-11-24): a cold build 28 min (notebooks
# 1649 s, Sphinx 20 s); after a one-line change in a module no notebook uses 54 s (all cached).
site: $(SITE_STAMP)
	$(BIN)/python site/build.py --preset tiny $(SITE_ARGS)

# every page of build/site in headless Chromium (Debian: apt-get install chromium chromium-driver):
# fails on an external request, a broken link or image, a console error or a cell error output,
# a missing favicon or download link, a mangled code span, untypeset math, and, at a phone's 390 px,
# a page wider than the screen, an unreadably shrunk figure, an uncued scrolling box or the "Back to
# top" pill over text; screenshots (1600 px and 390 px) in build/site-check/. First the check's
# own tests (it must catch each defect).
site-check: $(SITE_STAMP)
	$(BIN)/python -m pytest -q site/tests
	$(BIN)/python site/check.py

# --- mutation check (slow, not part of make test): hand-written bugs planted one at a time in a
# copy of the repository; the unit tests must catch each. Survivors are listed and fail the
# target. MUTATE picks the course_utils modules, MUTATION_ARGS adds options (see tools/mutants.py)
.PHONY: mutation
MUTATE ?= memory unet config inplace_abn parallel allocator amp_rules train explorer numerics gpu_kit
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

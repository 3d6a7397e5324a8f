#!/usr/bin/env bash
# The wheels a CUDA machine without network needs, besides its own torch, numpy, pandas,
# matplotlib, tqdm and pytest, to run the course from a checkout: the GPU kit
# (tools/gpu_kit.sh, python -m course_utils.gpu_report) and the notebook tests (nbval). Downloaded here, for the
# other machine's Python (default 3.12) on x86-64 Linux, into a folder (default .whl/, ignored by
# git); carry it there and install with the command printed at the end. `make test-compat` uses
# the same wheels the same way.
#
#   tools/gpu_wheels.sh [DIR] [PYTHON_VERSION]
set -euo pipefail
dir=${1:-.whl}
py=${2:-3.12}
mkdir -p "$dir"
python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$dir" \
  nbval ipykernel ipywidgets nbclient nbformat
echo "$(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir. On the other machine, from the checkout"
echo "(the device tool: carry [\"$dir\"], timeout_s 600):"
echo "  tools/gpu_kit.sh --budget 540     # installs $dir's wheels, then the kit into \$OUT (docs/gpu-kit.md)"

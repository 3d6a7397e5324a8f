#!/usr/bin/env bash
# make test-compat TORCH=2.11.0 [COMPAT_PYTHON=python3.12]
#
# The course on another PyTorch, run the way a CUDA machine with its own torch runs it (the GPU
# machines this course is checked on have torch 2.11 and Python 3.12, and no network):
#   * a virtual environment of its own, .venv-torch-VERSION, with that torch and the packages
#     such a machine already has (numpy, pandas, matplotlib, tqdm, pytest, pytest-timeout);
#   * the Jupyter wheels tools/gpu_wheels.sh fetches, installed with --target, as they are carried
#     to a machine without network; the course itself NOT installed: PYTHONPATH=<wheels>:<checkout>;
#   * then the GPU kit's dry run (python -m course_utils.gpu_report --dry-run), and the whole
#     `make test` suite (unit tests, every notebook and solution through nbval) with the tests
#     marked `emulated` (the autocast emulation against this torch's real AutocastCUDA kernels).
# Logs and the dry run's report land in build/compat-VERSION/. pip's configuration files are not
# read (PIP_CONFIG_FILE=/dev/null): a machine-wide constraint on torch (this project's dev
# machines cap it at 2.14.1) would refuse the version asked for. PyPI's torch is a CUDA build
# (about 3 GB with its nvidia-* packages, downloaded once); it runs on the CPU here.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: tools/test_compat.sh TORCH_VERSION [PYTHON]}
python=${2:-python3.12}
if ! command -v "$python" >/dev/null || ! "$python" -c 'import sys' 2>/dev/null; then
  found=$(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
  [ -n "$found" ] || { echo "error: $python not found; pass COMPAT_PYTHON=/path/to/python3.12" >&2; exit 2; }
  python=$found
fi
venv=.venv-torch-$version
out=build/compat-$version
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
mkdir -p "$out"
if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==$version" numpy pandas matplotlib tqdm pytest pytest-timeout
  touch "$venv/.installed"
fi
pyver=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
rm -rf "$out/site"
tools/gpu_wheels.sh "$out/wheels" "$pyver" >/dev/null
"$venv/bin/python" -m pip install -q --no-index --no-deps --target "$out/site" "$out"/wheels/*.whl
installed=$(date +%s)
export PYTHONPATH="$PWD/$out/site:$PWD" COURSE_SIZE=tiny MPLBACKEND=Agg PYTHONUNBUFFERED=1
"$venv/bin/python" - <<'PY'
import course_utils, pathlib, torch
here = pathlib.Path.cwd()
assert pathlib.Path(course_utils.__file__).resolve().is_relative_to(here), course_utils.__file__
print(f"torch {torch.__version__} (CUDA build {torch.version.cuda}); course_utils from {pathlib.Path(course_utils.__file__).parent}")
PY
status=0
"$venv/bin/python" -m course_utils.gpu_report "$out/gpu-report" --dry-run --fresh --budget 3600 \
  --only diagnose/seed003 diagnose/cublas diagnose/allocator tests benchmark/large examples/seed003 examples/fit \
  notebook/00 notebook/04 notebook/08 --techniques "baseline fp32" "autocast fp16" > "$out/gpu-report.log" 2>&1 || status=1
echo "gpu_report --dry-run: $([ $status = 0 ] && echo ok || echo FAILED) ($out/gpu-report.log)"
kit=$(date +%s)
"$venv/bin/python" -m pytest -q -m "not grader" tests notebooks solutions > "$out/pytest.log" 2>&1 || status=1
tail -40 "$out/pytest.log"
done_at=$(date +%s)
printf 'torch %s, Python %s: install %ss, GPU kit dry run %ss, make test suite %ss; %s\n' "$version" "$pyver" \
  $((installed - start)) $((kit - installed)) $((done_at - kit)) "$([ $status = 0 ] && echo passed || echo FAILED)" \
  | tee "$out/summary.txt"
exit $status

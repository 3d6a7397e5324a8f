#!/usr/bin/env bash
# The GPU kit as one prepared command for a lent GPU machine (no network, its own torch): install
# the Jupyter wheels carried in .whl/ (tools/gpu_wheels.sh downloads them here), then run the kit
# into $OUT (or gpu-report/), within --budget seconds (default 540), resuming where the runs under
# docs/gpu-runs/ stopped. Every argument goes to the kit:
#
#   tools/gpu_kit.sh --budget 540                 # a 15-minute window's first call (device run: timeout_s 600)
#   tools/gpu_kit.sh --budget 150                 # its second call, after --import of the first one's files
#   tools/gpu_kit.sh --plan                       # what it would run, in which order (no GPU needed)
#
# The kit stops starting tasks when the budget would be passed and stops a running one at the
# budget's end, so the call ends about 30 s after it (this script's install and the kit's start).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
site=${TMPDIR:-/tmp}/gpu-kit-site
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "gpu_kit.sh: installing the wheels of .whl/ failed. Fix: run tools/gpu_wheels.sh here again" >&2; exit 2; }
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 - <<'PY' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "nbval", "nbformat", "ipykernel", "pandas", "matplotlib", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_kit.sh: missing {', '.join(missing)}. Fix: run tools/gpu_wheels.sh on a machine with network "
             "and carry .whl/ along (device run: carry [\".whl\"])")
PY
exec python3 -m course_utils.gpu_report "${OUT:-gpu-report}" "$@"

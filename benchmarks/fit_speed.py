"""fit's speed: ``course_utils.fit`` on ResNet-50 against one prediction. Not a test: it measures.

    python benchmarks/fit_speed.py            # writes benchmarks/results/fit_speed.json
    python benchmarks/fit_speed.py --quick    # 1 repetition (a smoke run)

In one process, after one warm-up call of each, the CPU time (``time.process_time``) and the wall
time of three calls on ``fit_examples.resnet50`` at (32, 3, 224, 224), each repeated and the
median kept:

* (a) ``memory.predict_step`` -- one prediction, its defaults (MemTracker's per-module peaks on)
  except the target: class indices of shape (32,) with 1000 classes, the one ``fit`` gives it
  (the default target, the input's shape without its channel dim, does not match a classifier);
* (b) the same with ``module_peaks=False`` (what each of ``fit``'s predictions runs);
* (c) ``fit.fit(..., card_gib=8, techniques=[], progress=False)``: the probe, the plain step and
  its largest-batch search (the predictions it made: ``FitReport.predictions``).

The ratios c/a and c/b say what ``fit`` costs in predictions' worth of time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from course_utils.fit import fit  # noqa: E402
from course_utils.fit_examples import resnet50  # noqa: E402
from course_utils.memory import predict_step  # noqa: E402

SHAPE = (32, 3, 224, 224)
CARD_GIB = 8
PARAMETERS = 25_557_032  # torchvision's resnet50()
CLAIM = 3.0  # fit at most this many predictions' worth of time


def _timed(call: Callable[[], Any], repeats: int) -> tuple[dict[str, Any], Any]:
    """``call()`` once to warm up, then ``repeats`` times: CPU and wall seconds of each, medians."""
    call()
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        out = call()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu_s": round(statistics.median(cpu), 3), "wall_s": round(statistics.median(wall), 3),
            "cpu_s_each": [round(s, 3) for s in cpu], "wall_s_each": [round(s, 3) for s in wall]}, out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def measure(repeats: int) -> dict[str, Any]:
    """The three calls timed, the ratios, and what they ran on."""
    n_params = sum(p.numel() for p in resnet50().parameters())
    assert n_params == PARAMETERS, f"resnet50 has {n_params:,} parameters, torchvision's {PARAMETERS:,}"
    target = dict(target_shape=(SHAPE[0],), n_classes=1000)
    load_before = os.getloadavg()
    a, pa = _timed(lambda: predict_step(resnet50, SHAPE, **target), repeats)
    b, pb = _timed(lambda: predict_step(resnet50, SHAPE, **target, module_peaks=False), repeats)
    c, rep = _timed(lambda: fit(resnet50, SHAPE, card_gib=CARD_GIB, techniques=[], progress=False), repeats)
    load_after = os.getloadavg()
    assert pa.parameters == pb.parameters == rep.parameters == PARAMETERS
    assert pa.peak == pb.peak == rep.prediction.peak, "module_peaks and fit must not change the peak"
    row = rep.rows[0]
    ratios = {f"c/{k} {t}": round(c[f"{t}_s"] / x[f"{t}_s"], 2) for k, x in (("a", a), ("b", b)) for t in ("cpu", "wall")}
    return {
        "meta": {
            "date": datetime.date.today().isoformat(), "commit": _commit(), "torch": torch.__version__,
            "python": platform.python_version(), "cpu": platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "repeats": repeats,
            "model": f"fit_examples.resnet50 ({PARAMETERS:,} parameters), input {SHAPE}, 1000 classes, "
                     "cross-entropy, Adam, steady state, fp32, CUDA's rules (fake tensors)",
            "method": "one process; each call once to warm up, then timed repeats times (time.process_time for "
                      "CPU, time.perf_counter for wall), median kept. (a) memory.predict_step(resnet50, "
                      f"{SHAPE}, target_shape=(32,), n_classes=1000), defaults otherwise (module_peaks=True): "
                      "one prediction; (b) the same with module_peaks=False; (c) fit.fit(resnet50, "
                      f"{SHAPE}, card_gib={CARD_GIB}, techniques=[], progress=False): probe, plain step and "
                      "its largest-batch search. Ratios: c's median over a's and b's, CPU and wall. "
                      "load_before / load_after: os.getloadavg() (1, 5, 15 min) around the measurements",
        },
        "a predict_step": a, "b predict_step module_peaks=False": b, "c fit": c,
        "ratios": ratios,
        "claim": f"c/a CPU <= {CLAIM:g}", "claim_holds": ratios["c/a cpu"] <= CLAIM,
        "fit": {"predictions": rep.predictions, "largest_batch": row.largest_batch, "verified": row.verified,
                "peak_bytes": rep.prediction.peak, "fits": rep.fits},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition (a smoke run); default 3")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fit_speed.json"))
    args = ap.parse_args(argv)
    res = measure(1 if args.quick else 3)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{'call':<40} {'CPU s':>7} {'wall s':>7}")
    for k in ("a predict_step", "b predict_step module_peaks=False", "c fit"):
        print(f"{k:<40} {res[k]['cpu_s']:>7.2f} {res[k]['wall_s']:>7.2f}")
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in res["ratios"].items()))
    f = res["fit"]
    print(f"fit: {f['predictions']} predictions, largest batch {f['largest_batch']} "
          f"({'verified' if f['verified'] else 'not verified'}); {res['claim']}: {res['claim_holds']}; "
          f"load {res['meta']['load_before']} -> {res['meta']['load_after']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

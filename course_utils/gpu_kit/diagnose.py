"""Why a prediction misses on a GPU: the first GPU run's open misses, opened up op by op.

2026-11-24 (docs/gpu-runs/2026-11-24-h100.md) left three misses: seed 003's net 16.2 % above its
prediction in backward (6 x N^3 x 4 bytes at three N, the after-forward figure exact), the small
net in fp16 6.3 % above, the allocator model's peak reserved 304 vs 374 MiB. What a fake-tensor
prediction cannot see is memory an op takes besides its outputs: a cuDNN convolution's workspace
(given back before the op returns: a *transient*) and cuBLAS's (kept by its handle).

* ``step_case`` -- one step predicted, measured, and recorded op by op (``memory.OpTransients``)
  under each of ``SETTINGS``: cuDNN's default, its autotuner (``cudnn.benchmark``), TF32 off, and
  cuDNN off (PyTorch's own convolution kernels, which take no cuDNN workspace). Where the miss is a
  workspace, the op during which the peak happens has a transient of about the miss, and the
  miss moves with the settings; the live blocks at the peak (``allocator.peak_blocks``) say
  which tensors make it up; and the prediction's own step, op by op on fake tensors
  (``compare_ops``), names every op whose real output storage is larger than its fake one (on
  this CPU, ``mse_loss``'s scalar keeps the input-sized buffer it was reduced from: N^3 x 4 bytes
  at seed 003's N, which the fake kernel does not allocate).
* ``cublas`` -- the memory a first matrix product keeps beyond its output, forward and backward
  (the backward runs on autograd's device thread, whose cuBLAS handle is another), against
  ``CUBLAS_WORKSPACE_CONFIG`` and ``CUBLASLT_WORKSPACE_SIZE``.
* ``allocator_case`` -- the allocator model's gpu test (a small U-Net, two steps): the real
  allocator's reserved bytes per pool against the model's, and the step's transients.

On a CPU (the kit's dry run) the same code runs at tiny sizes, read by a ``LiveBytes`` meter
(``OpTransients``' stand-in): every transient is then 0 by construction.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from .. import allocator
from .. import explorer
from ..benchmark import configs
from ..checks import RecordError, guard
from ..limit_test import LimitTestNet
from ..memory import (
    BOOKKEEPING,
    LiveBytes,
    LiveBytesStats,
    MiB,
    OpTransients,
    align_ops,
    cuda_rules,
    measure_step,
    op_memory_step,
    predict_step,
)
from ..fit import variant
from ..fit_examples import vit_tiny
from ..unet import UNet3D

#: name -> the backends' switches it sets (anything not named keeps PyTorch's default)
SETTINGS: dict[str, dict[str, bool]] = {
    "cuDNN default": {},
    "cudnn.benchmark": {"cudnn.benchmark": True},
    "TF32 off": {"cudnn.allow_tf32": False, "cuda.matmul.allow_tf32": False},
    "cuDNN off": {"cudnn.enabled": False},
}
_SWITCHES = {"cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
             "cudnn.allow_tf32": (torch.backends.cudnn, "allow_tf32"),
             "cudnn.enabled": (torch.backends.cudnn, "enabled"),
             "cuda.matmul.allow_tf32": (torch.backends.cuda.matmul, "allow_tf32")}
TINY_VOLUME = (16, 32, 32)
#: fit's ViT-tiny as the kit's examples/fit runs it: (build, full shape, dry run's shape, classes)
VIT_TINY = (vit_tiny, (256, 3, 64, 64), (2, 3, 64, 64), 10)
SEED003_N = 128


@contextlib.contextmanager
def setting(name: str) -> Iterator[dict[str, bool]]:
    """The backends' switches as ``SETTINGS[name]`` says (the others at PyTorch's defaults), all
    restored afterwards. Yields every switch's value inside."""
    saved = {k: getattr(obj, attr) for k, (obj, attr) in _SWITCHES.items()}
    wanted = {"cudnn.benchmark": False, "cudnn.allow_tf32": True, "cudnn.enabled": True,
              "cuda.matmul.allow_tf32": saved["cuda.matmul.allow_tf32"], **SETTINGS[name]}
    try:
        for k, v in wanted.items():
            setattr(*_SWITCHES[k], v)
        yield {k: getattr(obj, attr) for k, (obj, attr) in _SWITCHES.items()}
    finally:
        for k, v in saved.items():
            setattr(*_SWITCHES[k], v)


def cases(dry_run: bool) -> dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...], dict[str, Any]]]:
    """The steps diagnosed: name -> (build, input shape, ``predict_step`` / ``measure_step``
    keyword arguments). Full size on a GPU; the tiny preset's shapes in a dry run."""
    n = 16 if dry_run else SEED003_N
    cube = (1, 1, n, n, n)
    out = {"seed003": (LimitTestNet, cube, dict(target_shape=cube, optimizer=None, steady_state=False))}
    for key, net, technique in (("small-fp16", "small", "fp16 model (seed 000)"),
                                ("large-fp32", "large", "baseline fp32"),
                                ("small-autocast-lean", "small", "autocast fp16 + lean Up")):
        cfg = configs(net)[technique]
        if dry_run:
            cfg = replace(cfg, volume=TINY_VOLUME)
        dtype, ac = explorer.PRECISIONS[cfg.precision]
        if dry_run and dtype == torch.float16:  # reduced-precision Conv3d on a CPU: ~500x slower than fp32
            dtype = torch.float32
        if dry_run and ac == torch.float16:
            ac = None
        out[key] = ((lambda cfg=cfg: explorer.build(cfg)), (cfg.batch, 1, *cfg.volume),
                    dict(n_classes=5, dtype=dtype, autocast_dtype=ac))
    build, full, tiny, classes = VIT_TINY
    shape = tiny if dry_run else full
    out["vit-tiny"] = (variant(build, "plain"), shape, dict(target_shape=(shape[0],), n_classes=classes))
    return out


def _mib(n: float) -> float:
    return round(n / MiB, 2)


def _row(r: Any) -> dict[str, Any]:
    return {"op": r.op, "phase": r.phase, "node": r.node, "index": r.index, "before MiB": _mib(r.before),
            "transient MiB": _mib(r.transient), "kept beyond outputs MiB": _mib(r.kept_extra),
            "outputs MiB": _mib(r.new_outputs)}


def summarize_ops(ops: OpTransients, predicted: int | None = None, top: int = 5) -> dict[str, Any]:
    """What an op-by-op step shows: its peak, the op during which the peak happened, the largest
    transients and what ops kept beyond their outputs, summed up by op."""
    at_peak = max(ops.rows, key=lambda r: r.peak) if ops.rows else None
    out: dict[str, Any] = {"ops": len(ops.rows), "peak MiB": _mib(ops.peak), "peak reserved MiB": _mib(ops.peak_reserved)}
    if predicted:
        out["miss %"] = round(100 * (predicted - ops.peak) / ops.peak, 1) if ops.peak else None
        out["measured - predicted MiB"] = _mib(ops.peak - predicted)
    if at_peak is not None:
        out["peak during"] = _row(at_peak)
    out["largest transients"] = [_row(r) for r in ops.largest("transient", top)]
    out["transient by op"] = [{**d, "max": _mib(d["max"]), "total": _mib(d["total"])} for d in ops.by_op("transient")[:top]]
    out["kept beyond outputs by op"] = [{**d, "max": _mib(d["max"]), "total": _mib(d["total"])}
                                        for d in ops.by_op("kept_extra")[:top]]
    return out


def compare_ops(measured: OpTransients, predicted: OpTransients, top: int = 8) -> dict[str, Any]:
    """The two steps' ops aligned by name (``difflib``, bookkeeping ops left out), and where an
    op's new output storages are larger in ``measured`` than in ``predicted``: memory a real
    kernel allocates that the fake kernels the prediction follows do not (an output kept in a
    larger buffer, a scratch tensor returned with the result)."""
    pairs = align_ops(measured.rows, predicted.rows)
    larger, smaller = [], []
    for ra, rb in pairs:
        d = ra.new_outputs - rb.new_outputs
        row = {"op": ra.op, "phase": ra.phase, "node": ra.node, "index": ra.index,
               "measured MiB": _mib(ra.new_outputs), "predicted MiB": _mib(rb.new_outputs), "bytes more": d}
        (larger if d > 0 else smaller if d < 0 else []).append(row)
    paired = {id(r) for pair in pairs for r in pair}
    unmatched = lambda rows: sorted({r.op for r in rows if id(r) not in paired and r.op not in BOOKKEEPING})  # noqa: E731
    out = {"ops matched": len(pairs), "ops only measured": unmatched(measured.rows)[:10],
           "ops only predicted": unmatched(predicted.rows)[:10],
           "outputs larger than predicted MiB": _mib(sum(r["bytes more"] for r in larger)),
           "outputs smaller than predicted MiB": _mib(-sum(r["bytes more"] for r in smaller))}
    for label, rows in (("larger", larger), ("smaller", smaller)):
        out[f"ops whose outputs are {label}"] = sorted(rows, key=lambda r: -abs(r["bytes more"]))[:top]
    return out


def _clear() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def step_case(name: str, dry_run: bool, log: Callable[[str], None] = print) -> tuple[dict[str, Any], dict[str, Any]]:
    """One of ``cases``: predicted; measured plainly (cuDNN's default); op by op under each
    setting; the live blocks at the plain step's peak. Returns ``(result, detail)``: the
    result for kit.json, every op's row for the details archive."""
    build, shape, kw = cases(dry_run)[name]
    device = "cpu" if dry_run else "cuda"
    pred = predict_step(build, shape, module_peaks=False, **kw)
    result: dict[str, Any] = {"case": name, "shape": list(shape), "predicted peak MiB": _mib(pred.peak),
                              "predicted peak in": "{} ({})".format(*pred.log.peak_location), "settings": {}}
    detail: dict[str, Any] = {}
    if not dry_run:
        _clear()
        with setting("cuDNN default"):
            holder: dict[str, Any] = {}
            peak, blocks = allocator.peak_blocks(lambda: holder.update(m=measure_step(build, shape, **kw)),
                                                 stacks="python")
        result["measured peak MiB"] = _mib(holder["m"].peak_allocated)
        result["measured reserved MiB"] = _mib(holder["m"].peak_reserved)
        result["miss %"] = round(100 * (pred.peak - holder["m"].peak_allocated) / holder["m"].peak_allocated, 1)
        result["largest at the peak"] = [f"{b.size / MiB:.1f} MiB {b.where(2)}" for b in blocks[:6]]
        detail["blocks at the peak"] = [{"MiB": _mib(b.size), "frames": b.frames[:16]} for b in blocks[:30]]
    for label in SETTINGS:
        _clear()
        try:
            with setting(label) as switches:
                ops, _ = op_memory_step(build, shape, device=device, **kw)
        except Exception as err:  # e.g. PyTorch's own 3D convolution out of memory with cuDNN off: the rest goes on
            result["settings"][label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            log(f"diagnose/{name}, {label}: {result['settings'][label]['error']}")
            continue
        result["settings"][label] = {"switches": switches, **summarize_ops(ops, pred.peak)}
        detail[label] = [r.as_dict() for r in ops.rows]
        if label == "cuDNN default":  # the measured step's ops against the predicted step's, one by one
            fake, _ = op_memory_step(build, shape, device="cpu", within=cuda_rules(kw.get("autocast_dtype")), **kw)
            result["outputs against the prediction"] = compare_ops(ops, fake)
            detail["predicted, op by op"] = [r.as_dict() for r in fake.rows]
        log(f"diagnose/{name}, {label}: peak {result['settings'][label]['peak MiB']} MiB, "
            f"{len(ops.rows)} ops, largest transient "
            f"{result['settings'][label]['largest transients'][:1] or 'none'}")
        del ops
    if "measured peak MiB" in result and "peak MiB" in result["settings"]["cuDNN default"]:
        # the op-by-op step is the same step: its peak must agree
        result["op-by-op peak - plain peak MiB"] = round(
            result["settings"]["cuDNN default"]["peak MiB"] - result["measured peak MiB"], 2)
    return result, detail


def cublas(dry_run: bool, n: int = 1024) -> dict[str, Any]:
    """What the first matrix products keep beyond their outputs: a forward ``mm``, its backward
    (another thread, another handle), a second forward (the workspace reused), and an fp16
    ``addmm`` under autocast (cuBLASLt's path). On a CPU: 0 by construction."""
    device = "cpu" if dry_run else "cuda"
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if not dry_run:
        _clear()
        if clear is not None:
            clear()  # the handles' workspaces, so that the first product allocates them again
    live = LiveBytes(round_to=512)
    stats = LiveBytesStats(live) if dry_run else None
    x = torch.randn(n, n, device=device, requires_grad=True)
    w = torch.randn(n, n, device=device, requires_grad=True)
    lin = torch.nn.Linear(n, n).to(device)
    phases: dict[str, Any] = {}
    with live if dry_run else contextlib.nullcontext():
        for label, fn in (("forward mm", lambda: x @ w),
                          ("backward of mm", lambda: (x @ w).sum().backward()),
                          ("second forward mm", lambda: x @ w),
                          ("autocast fp16 linear (addmm)", lambda: _autocast_linear(lin, x, device))):
            with OpTransients(stats) as ops:
                fn()
            phases[label] = [{"op": d["op"], "phase": d["phase"], "calls": d["calls"], "kept MiB": _mib(d["max"])}
                             for d in ops.by_op("kept_extra")]
    return {"matrix": f"{n} x {n} fp32", "phases": phases,
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "(unset: PyTorch's default)"),
            "CUBLASLT_WORKSPACE_SIZE": os.environ.get("CUBLASLT_WORKSPACE_SIZE", "(unset: PyTorch's default)"),
            "capability": list(torch.cuda.get_device_capability()) if not dry_run else None,
            "method": "memory_allocated after - before - the op's new outputs, synchronised, op by op"
                      if not dry_run else "dry run: a LiveBytes meter (0 by construction)"}


def _autocast_linear(lin: torch.nn.Module, x: torch.Tensor, device: str) -> torch.Tensor:
    if device == "cpu":  # fp16 on a CPU is the slow path: the dry run runs the code, in bf16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lin(x.detach())
    with torch.autocast("cuda", dtype=torch.float16):
        return lin(x.detach())


def _pools(stats: dict[str, Any]) -> dict[str, float]:
    return {pool: _mib(stats.get(f"reserved_bytes.{pool}_pool.peak", 0)) for pool in ("small", "large")}


def allocator_case(dry_run: bool) -> dict[str, Any]:
    """The allocator model's gpu test (``tests/test_allocator_sim.py``): two steps of a small
    U-Net replayed through the model, against the real allocator's peak reserved bytes per
    pool; and the measured step's transients, which the model does not replay."""
    build = lambda: UNet3D(levels=4, channels=16)  # noqa: E731 (the test's net)
    shape = (2, 1, 16, 32, 32) if dry_run else (2, 1, 32, 64, 64)
    resident, events, _ = allocator.trace_step(build, shape)
    sim = allocator.simulate(events, resident=resident)
    pools_sim = {"small": 0.0, "large": 0.0}
    for seg in range(len(sim.allocator.segments)):
        if sim.allocator.segments[seg]:
            pools_sim[sim.allocator.pool(seg)] += _mib(sim.allocator.segment_size_of(seg))
    out: dict[str, Any] = {"shape": list(shape), "simulated peak reserved MiB": _mib(sim.peak_reserved),
                           "simulated reserved by pool MiB": pools_sim,
                           "simulated peak allocated MiB": _mib(sim.peak_allocated)}
    if not dry_run:
        _clear()
        torch.cuda.reset_peak_memory_stats()
        real = measure_step(build, shape, n_classes=5)
        out.update({"measured peak reserved MiB": _mib(real.peak_reserved),
                    "measured peak allocated MiB": _mib(real.peak_allocated),
                    "measured reserved by pool MiB (peak)": _pools(torch.cuda.memory_stats()),
                    "segments": _segments()})
        out["miss %"] = round(100 * (sim.peak_reserved - real.peak_reserved) / real.peak_reserved, 1)
        _clear()
    ops, _ = op_memory_step(build, shape, device="cpu" if dry_run else "cuda", n_classes=5)
    out["op by op"] = summarize_ops(ops)
    return out


def _segments() -> dict[str, Any]:
    """The real allocator's segments now: how many and how large, per pool."""
    by: dict[str, list[int]] = {"small": [], "large": []}
    for seg in torch.cuda.memory_snapshot():
        by.setdefault(seg.get("segment_type", "?"), []).append(seg["total_size"])
    return {pool: {"count": len(sizes), "MiB": _mib(sum(sizes)), "sizes MiB": sorted((_mib(s) for s in sizes),
                                                                                    reverse=True)[:12]}
            for pool, sizes in by.items()}


guard(globals(), RecordError)

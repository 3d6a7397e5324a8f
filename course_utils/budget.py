"""What a card holds beyond a prediction: the budget every notebook, ``fit`` and the explorer use.

A prediction (``memory.predict_step``) is what ``torch.cuda.max_memory_allocated`` would show. A
card needs more, and this module is the one place that says how much:

* ``Overheads`` -- the CUDA context (part of the card, never in ``memory_allocated``) and a slack
  for what a prediction cannot see (cuDNN workspaces, allocator rounding and fragmentation).
  ``overheads()`` reads the context measured on a GPU when a run was recorded (``recorded``),
  else assumes it, and says which in ``Overheads.source``; ``seed000_overheads()`` is the context
  seed 000's own numbers imply (~1.1 GiB), the alternative a learner compares with; ``contexts()``
  names them all (assumed, measured where recorded, the highest a run measured, seed 000's).
* ``context_readings`` -- every CUDA context a GPU run of the course measured in one process
  (``docs/gpu-runs/``): the context grows during a run, as CUDA loads the kernels it uses.
* ``usable_bytes(card_gib)`` -- the largest predicted peak a card holds under ``overheads()``.
* ``cublas_workspaces`` -- the cuBLAS workspaces a step with matrix products keeps (PyTorch's
  documented default per card, or ``CUBLAS_WORKSPACE_CONFIG``): ``fit`` adds them as a line of
  their own (``Overheads.workspace_bytes``).
* ``BatchModel`` / ``batch_model`` -- the steady-state peak as ``fixed + batch x per_sample``
  (``steady_state``: Adam's moments resident; ``fixed_bytes``: what does not grow with the batch),
  from which the largest batch follows.
* ``ddp_bucket_bytes`` -- what DDP's gradient buckets add on each rank.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .checks import RecordError, TechniqueError, guard
from .files import skipped
from .memory import MiB
from .recorded import benchmark_records, lookup, read_kit, run_label
from .recorded import runs_folder as recorded_runs


@dataclass(frozen=True)
class Overheads:
    """Memory a card needs beyond the predicted ``max_memory_allocated``."""

    context_mib: float  # CUDA context + libraries: part of the card, never in memory_allocated
    slack: float  # fraction of the predicted peak: workspaces, rounding, fragmentation
    source: str
    workspace_bytes: int = 0  # cuBLAS workspaces, a line of their own (``cublas_workspaces``)

    def needed(self, predicted_peak: float) -> float:
        """Bytes of the card a step with this predicted allocated peak needs."""
        _check_bytes("Overheads.needed", "predicted_peak", predicted_peak,
                     "the predicted peak in bytes (memory.predict_step(...).peak)")
        return predicted_peak * (1 + self.slack) + self.workspace_bytes + self.context_mib * MiB

    def usable(self, card_bytes: float) -> float:
        """The largest predicted allocated peak a card of ``card_bytes`` holds (``needed``'s inverse);
        0 for a card that does not even hold the CUDA context and the workspaces (nothing fits). A
        "card" under 1 MiB is refused: a card given in GiB where bytes are meant is the usual cause."""
        _check_bytes("Overheads.usable", "card_bytes", card_bytes, "the card's memory in bytes (8 GiB: 8 * 2**30)")
        if card_bytes < MiB:
            raise TechniqueError(f"Overheads.usable: a card of {card_bytes:,.0f} bytes: less than 1 MiB.",
                                 "pass the card's memory in bytes (8 GiB: 8 * 2**30), not in GiB.")
        return max(0.0, (card_bytes - self.context_mib * MiB - self.workspace_bytes) / (1 + self.slack))


def _check_bytes(where: str, name: str, value: float, what: str) -> None:
    """A count of bytes: a finite number >= 0 (methods are not guarded: ``checks.guard``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise TechniqueError(f"{where}: {name}={value!r} is not a finite number of bytes >= 0.", f"pass {what}.")


#: the slack assumed: seed 000's own hook table shows reserved/allocated of 1.05-1.10 at its peaks
ASSUMED_SLACK = 0.10
ASSUMED_CONTEXT_MIB = 500.0


def _slack_source() -> str:
    """Where the slack comes from, and the reserved/allocated ratio a GPU run recorded (if any)."""
    slack = (f"slack {ASSUMED_SLACK * 100:.0f} % of the allocated peak (seed 000's own hook table shows "
             "reserved/allocated of 1.05-1.10 at its peaks)")
    ratio = lookup("gpu/reserved_over_allocated")
    if ratio is not None:
        slack += (f"; reserved/allocated without a cap {ratio.label}: median {ratio.value['median']}, "
                  f"max {ratio.value['max']} (the cache the allocator frees before it raises out of memory)")
    return slack


def _assumed(what: str) -> Overheads:
    return Overheads(
        ASSUMED_CONTEXT_MIB, ASSUMED_SLACK,
        f"{what}: CUDA context {ASSUMED_CONTEXT_MIB:.0f} MiB (a few hundred MiB on recent "
        f"GPUs with lazy module loading); {_slack_source()}")


def measured_overheads() -> Overheads | None:
    """The CUDA context a recorded GPU run measured (``recorded``: ``00/cuda_context``), with the
    slack assumed; None where no GPU run has been recorded."""
    ctx = lookup("00/cuda_context")
    if ctx is None:
        return None
    mib = ctx.value.get("context_MiB") if isinstance(ctx.value, dict) else None
    if not (isinstance(mib, numbers.Real) and not isinstance(mib, bool) and 0 < mib < math.inf):
        skipped(RecordError(f"the recorded figure 00/cuda_context ({ctx.label}) has no context_MiB "
                            f"that is a positive number: {mib!r}; the assumed context serves instead.",
                            "record it again on a GPU (notebook 00), or restore recorded/ "
                            "(`git checkout -- recorded`)."))
        return None
    return Overheads(float(mib), ASSUMED_SLACK,
                     f"context measured, slack assumed: CUDA context {float(mib):.0f} MiB "
                     f"{ctx.label}; {_slack_source()}")


def overheads() -> Overheads:
    """The CUDA context measured on a GPU when a run was recorded (else assumed), and the slack
    assumed. A recorded run's reserved/allocated ratio is not used as the slack: measured without
    a cap, it is the cache the allocator keeps while nothing presses on it, which it frees (and
    retries) before it raises out of memory. README's benchmark sets the largest batch predicted
    with these overheads beside the one measured under a cap."""
    return measured_overheads() or _assumed("assumed (no GPU run recorded)")


def contexts() -> dict[str, Overheads]:
    """The CUDA contexts a budget can rest on, each with the same slack, by name: ``"assumed"``
    (``ASSUMED_CONTEXT_MIB``, what ``overheads()`` uses where no GPU run is recorded),
    ``"measured"`` (a recorded GPU run's, what ``overheads()`` uses then; absent without one),
    ``"measured, highest"`` (the highest of ``context_readings()``, where it is above the
    measured one: the context grows during a run) and ``"seed 000"`` (what seed 000's own numbers
    imply, ``seed000_overheads``). Notebook 10 sets the largest batch under each beside the one
    it uses."""
    out = {"assumed": _assumed("assumed (the course's default where no GPU run is recorded)")}
    measured = measured_overheads()
    if measured is not None:
        out["measured"] = measured
        high = max(context_readings(), key=lambda r: r.mib, default=None)
        if high is not None and high.mib > measured.context_mib + 1:
            out["measured, highest"] = Overheads(
                high.mib, ASSUMED_SLACK, f"the highest context a GPU run measured: {high.mib:.0f} MiB on "
                f"{high.run}, {high.when}; {_slack_source()}")
    out["seed 000"] = seed000_overheads()
    return out


@dataclass(frozen=True)
class ContextReading:
    """One CUDA context a GPU run measured (``benchmark.cuda_context_bytes``: the driver's used
    memory minus the allocator's reserved memory, after a convolution), in one process."""

    mib: float
    run: str  # "NVIDIA H200, 2026-11-27, torch 2.11.0+cu130"
    when: str  # the moment of the run


#: how a benchmark's meta states the context its cap left out ("... measured context (773 MiB) ...")
_BENCHMARK_CONTEXT = re.compile(r"measured context \((\d+(?:\.\d+)?) MiB\)")


def benchmark_context_mib(meta: dict) -> float | None:
    """The CUDA context a benchmark's run measured and capped its allocator below (its meta's
    ``measured`` text), or None where it does not say (a dry run)."""
    found = _BENCHMARK_CONTEXT.search(str(meta.get("measured", "")))
    return float(found.group(1)) if found else None


def context_readings(runs_folder: str | Path | None = None) -> list[ContextReading]:
    """Every CUDA context the GPU runs recorded under ``runs_folder`` (default: ``docs/gpu-runs/``
    beside ``recorded_folder()``) measured, each once, lowest first: at a kit's start
    (``kit.json``; the first run's ``limit.json``), and before each benchmark (its meta: after the
    tasks before it, in the same process). Each is one process's. Under lazy module loading (the
    default: PyTorch sets ``CUDA_MODULE_LOADING=LAZY`` since 1.13, CUDA since 12.2 on Linux) the
    context grows as the process loads the kernels its steps use. Readings taken in a notebook
    kernel beside the kit's own process (notebook 00's table) count both and are left out."""
    folder = recorded_runs(runs_folder)
    found: dict[tuple, ContextReading] = {}

    def add(mib: float | None, meta: dict, when: str) -> None:
        if mib is not None:
            r = ContextReading(round(float(mib), 1), run_label(meta), when)
            found.setdefault((round(r.mib), r.run, r.when), r)

    for path in sorted(folder.glob("*/kit.json")) + sorted(folder.glob("*/limit.json")):
        try:
            data, machine, mib = read_kit(path)  # kit.json: its machine's reading
            if path.name == "limit.json":  # the first run's: its limit step's own reading
                over = data.get("overheads")
                mib = over.get("context MiB") if isinstance(over, dict) else None
        except RecordError as err:  # the others still serve
            skipped(err)
            continue
        add(mib if isinstance(mib, numbers.Real) and math.isfinite(mib) and mib > 0 else None, machine,
            "at the kit's start, after a first convolution" if path.name == "kit.json"
            else "in the kit's limit step, after a first convolution")
    for path, data in benchmark_records(folder=folder):  # one that cannot be read: skipped, with a warning
        net = path.stem.split("-")[1]
        add(benchmark_context_mib(data["meta"]), data["meta"], f"before the benchmark of the {net} net")
    return sorted(found.values(), key=lambda r: r.mib)


#: Seed 000's own figures (shared/seeds/unet3d_memory_question.txt): nvidia-smi showed "around
#: 7000MiB" at the peak, and the largest ``mem_cached`` of its hook table (PyTorch's reserved
#: memory) was 6,121,586,688 B = 5,838 MiB. What nvidia-smi counts beyond the caching allocator's
#: reserve is the CUDA context and its libraries: 7000 - 5838 = 1,162 MiB (~1.1 GiB).
SEED000_SMI_MIB = 7000
SEED000_PEAK_CACHED_BYTES = 6_121_586_688


def seed000_overheads(slack: float | None = None) -> Overheads:
    """The context seed 000's own numbers imply (nvidia-smi's peak less the allocator's largest
    reserve; ``SEED000_SMI_MIB``, ``SEED000_PEAK_CACHED_BYTES``), with the slack of
    ``overheads()`` unless ``slack`` is given: the alternative to the assumed 500 MiB."""
    context = SEED000_SMI_MIB - SEED000_PEAK_CACHED_BYTES / MiB
    slack = overheads().slack if slack is None else slack
    return Overheads(context, slack,
                     f"seed 000's numbers: nvidia-smi ~{SEED000_SMI_MIB} MiB less its largest mem_cached "
                     f"{SEED000_PEAK_CACHED_BYTES / MiB:,.0f} MiB = {context:,.0f} MiB outside the caching "
                     f"allocator (their GPU, driver and libraries); slack {100 * slack:.0f} % as the default")


#: PyTorch's documented default ``CUBLAS_WORKSPACE_CONFIG`` (docs, "CUDA environment variables":
#: ":4096:2:16:8 ... a total size of 2 * 4096 + 8 * 16 KiB") and 32 MiB (":4096:8") on Hopper
#: (compute capability 9.0, since torch 2.3) and, in later versions, on Blackwell (10.x, 12.x)
#: (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize: "32MiB for Hopper and Blackwell")
CUBLAS_DEFAULT_CONFIG = ":4096:2:16:8"
CUBLAS_HOPPER_CONFIG = ":4096:8"


def cublas_config_bytes(config: str) -> int:
    """Bytes of a ``CUBLAS_WORKSPACE_CONFIG`` value: its ``:SIZE:COUNT`` pairs in KiB, summed (as
    PyTorch reads it: every match of the pattern counts, whatever separates them)."""
    pairs = re.findall(r":(\d+):(\d+)", config or "")
    if not pairs:
        raise TechniqueError(f"CUBLAS_WORKSPACE_CONFIG={config!r}: expected :SIZE:COUNT pairs in KiB, e.g. "
                             f"{CUBLAS_DEFAULT_CONFIG}.", "correct or unset it")
    return sum(int(a) * int(b) * 1024 for a, b in pairs)


#: the aten ops that run on cuBLAS on a GPU (a step with any of them keeps cuBLAS workspaces)
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "addmv", "mv",
                        "dot"})


def cublas_workspaces(compute_capability: tuple[int, int] | None, handles: int,
                      config: str | None = None) -> tuple[int, str]:
    """(bytes, how): the cuBLAS workspaces a step keeps allocated once it has run a matrix
    product. PyTorch allocates one per (cuBLAS handle, stream) through the caching allocator,
    so they count in ``memory_allocated``, and keeps them until
    ``torch._C._cuda_clearCublasWorkspaces()``; a handle belongs to a thread, and autograd's
    backward runs on a thread of its own (``handles=2`` for a training step, 1 for a forward).
    ``config``: ``CUBLAS_WORKSPACE_CONFIG`` if set (default: the environment's), else PyTorch's
    default for the card's compute capability."""
    config = config if config is not None else os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config is not None:
        src = f"CUBLAS_WORKSPACE_CONFIG={config} (set)"
    else:
        hopper = compute_capability is not None and compute_capability[0] in (9, 10, 12)
        config = CUBLAS_HOPPER_CONFIG if hopper else CUBLAS_DEFAULT_CONFIG
        cc = "unknown card" if compute_capability is None else f"compute capability {compute_capability[0]}.{compute_capability[1]}"
        src = f"PyTorch's documented default {config} for {cc}"
    each = cublas_config_bytes(config)
    return handles * each, (f"cuBLAS workspaces {handles} x {each / MiB:.3f} MiB ({src}; one per thread's handle: "
                            "forward" + (" and autograd's backward" if handles > 1 else "") + "; assumed, not measured)")


def usable_bytes(card_gib: float) -> int:
    """The largest predicted peak (``max_memory_allocated``) whose step fits a card of
    ``card_gib`` GiB: the card less the CUDA context, divided by 1 + the slack for workspaces and
    the allocator -- ``overheads()``, the same for every budget of the course."""
    return int(overheads().usable(card_gib * 2**30))


def steady_state(breakdown: dict[str, int]) -> dict[str, int]:
    """The breakdown of a step from the second on: Adam's two moments (2 x the parameter bytes)
    resident during forward and backward. A breakdown that already has them is returned as is."""
    out = dict(breakdown)
    if not out.get("Optstate"):
        out["Optstate"] = 2 * out["Parameter"]
        out["Total"] = out["Total"] + out["Optstate"]
    return out


#: the parts of a steady-state breakdown that do not grow with the batch (or the image)
FIXED_PARTS = ("Parameter", "Buffer", "Gradient", "Optstate")


def fixed_bytes(breakdown: dict[str, int]) -> int:
    """Parameters + buffers + gradients + optimizer state: the bytes of a breakdown that do not
    grow with the batch (``BatchModel``'s ``fixed``)."""
    return sum(breakdown.get(k, 0) for k in FIXED_PARTS)


@dataclass
class BatchModel:
    """Predicted steady-state peak as a function of the batch: ``fixed + batch * per_sample``.
    Parameters, buffers, gradients and optimizer state do not grow with the batch; activations,
    temporaries and the input do (linearly, for a conv net: checked in the tests)."""

    fixed: int
    per_sample: int
    breakdown: dict[str, int]  # steady-state breakdown at the predicted batch
    batch: int

    def peak(self, batch: int) -> int:
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 0:
            raise TechniqueError(f"BatchModel.peak: batch={batch!r} is not a whole number >= 0.",
                                 "pass the batch as a whole number of samples.")
        return self.fixed + batch * self.per_sample

    def largest_batch(self, budget_bytes: float) -> int:
        """The largest batch whose peak fits ``budget_bytes`` (0 where not even the fixed part does)."""
        _check_bytes("BatchModel.largest_batch", "budget_bytes", budget_bytes,
                     "the bytes the card holds for the step (budget.usable_bytes(card_gib))")
        if self.per_sample <= 0:
            raise TechniqueError(f"BatchModel.largest_batch: per_sample={self.per_sample}: the peak does not grow "
                                 "with the batch, so no budget sizes a batch.",
                                 "build the model from a prediction whose batch carries activations "
                                 "(batch_model(predict_step(...), batch) with batch >= 1).")
        return max(0, int((budget_bytes - self.fixed) // self.per_sample))


def batch_model(prediction, batch: int) -> BatchModel:
    """``BatchModel`` from one ``predict_step`` result at ``batch``."""
    b = steady_state(prediction.breakdown)
    fixed = fixed_bytes(b)
    return BatchModel(fixed=fixed, per_sample=-(-(b["Total"] - fixed) // batch), breakdown=b,
                      batch=batch)


def ddp_bucket_bytes(grad_bytes: int, gradient_as_bucket_view: bool = False) -> int:
    """Bytes DDP's gradient buckets add on each rank (computed): DDP all-reduces the gradients
    in flat buckets (``bucket_cap_mb``, 25 MiB by default, the first one 1 MiB) that together
    hold every gradient, in the gradients' dtype, for as long as the DDP model lives. With
    ``gradient_as_bucket_view=False`` (DDP's default, the course's) the ``.grad`` tensors are
    separate tensors and the buckets one more copy: + the gradient bytes. With ``True`` the
    gradients are views into the buckets: + 0 (torch 2.13's DDP docstring: "the saved memory
    size will be equal to the total gradients size"). ``ddp_worker`` measures it."""
    return 0 if gradient_as_bucket_view else grad_bytes


guard(globals(), TechniqueError)

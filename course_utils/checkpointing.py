"""Gradient checkpointing and activation offload: memory bought back with time.

PyTorch's ``torch.utils.checkpoint`` does the work; this module adds what a course needs:

* ``frozen_bn_stats`` / ``checkpointed`` -- recomputation runs BatchNorm's forward a second time,
  in training mode, so its running statistics would be updated twice per step. Non-reentrant
  checkpointing takes a ``context_fn`` whose second context wraps the recomputation: we freeze
  the statistics there.
* ``save_convolutions`` -- a selective-checkpointing policy: keep convolution outputs (expensive
  to recompute), recompute BatchNorm, activations and the rest (cheap).
* ``checkpoint_segments`` -- ``checkpoint_sequential`` done BN-safe (torch's own accepts no
  ``context_fn``, so it updates BN statistics twice); ``deep_stack`` / ``SegmentedStack`` -- a
  plain deep conv stack for the sqrt(n) experiment.
* ``offload_saved`` -- activation offload: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
  on a GPU; under ``FakeTensorMode`` a simulation that removes each saved tensor from the device
  (what the predictor needs); nothing on a real CPU (the activations already live in host memory).
* ``step_flops`` / ``recompute_fraction`` / ``step_counts`` / ``cost_estimate`` -- what a
  configuration costs in time, on a CPU: recomputed FLOPs counted by ``FlopCounterMode`` under
  ``FakeTensorMode``, the element-wise bytes, and the bytes offload moves (every save, as
  ``save_on_cpu`` copies it), converted to seconds at stated, assumed throughputs (an *estimate*).
* ``time_steps`` -- step times measured properly: warm-up, repetitions, variants interleaved,
  medians and the spread between repetitions (the noise) reported with them.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from .amp_rules import autocast_rules
from .checks import TechniqueError, guard
from .cost import ElementwiseBytes, SaveOnCpuMeter
from .memory import catch_oom, cuda_peak, default_dtype, predict_step, require_cuda, target_spec
from .recorded import ONLY_STEP, benchmark_records
from .train import training_step

_CONV_OPS = {torch.ops.aten.convolution.default, torch.ops.aten.cudnn_convolution.default}


@contextlib.contextmanager
def frozen_bn_stats(module: nn.Module) -> Iterator[None]:
    """Inside, every BatchNorm in ``module`` normalises with batch statistics as usual but
    leaves its running mean/var and batch counter exactly as they were (momentum 0)."""
    bns = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone())
             for m in bns]
    for m in bns:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, count) in zip(bns, saved, strict=True):
            m.momentum = momentum
            if count is not None:
                m.num_batches_tracked.copy_(count)


def save_convolutions(ctx, op, *args, **kwargs) -> CheckpointPolicy:  # noqa: ARG001 - torch's policy_fn(ctx, op, ...)
    """Selective-checkpointing policy: store convolution outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in _CONV_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_context(module: nn.Module | None, policy: Callable | None = None,
                       fix_bn: bool = True) -> Callable[[], tuple]:
    """The ``context_fn`` for ``checkpoint(..., use_reentrant=False)``: an optional selective
    policy, and the BatchNorms of ``module`` frozen during recomputation (``fix_bn``)."""

    def context_fn():
        fwd, rec = (create_selective_checkpoint_contexts(policy) if policy
                    else (contextlib.nullcontext(), contextlib.nullcontext()))
        if not fix_bn:
            return fwd, rec
        stack = contextlib.ExitStack()

        class _Recompute:
            def __enter__(self):
                # freeze first: its bookkeeping ops must run outside the selective policy's
                # dispatch mode, which expects exactly the ops of the forward pass
                stack.enter_context(frozen_bn_stats(module))
                stack.enter_context(rec)

            def __exit__(self, *exc):
                return stack.__exit__(*exc)

        return fwd, _Recompute()

    return context_fn


def checkpointed(fn: Callable, *args: torch.Tensor, policy: Callable | None = None,
                 fix_bn: bool = True, bn_scope: nn.Module | None = None) -> torch.Tensor:
    """``fn(*args)`` with its activations recomputed in backward (non-reentrant). The
    BatchNorms of ``bn_scope`` (default: ``fn`` itself, if it is a module) keep their running
    statistics while they are recomputed."""
    scope = bn_scope if bn_scope is not None else fn
    if fix_bn and not isinstance(scope, nn.Module):
        raise TypeError("checkpointed: pass bn_scope=<the module holding the BatchNorms> when "
                        "fn is not an nn.Module (or fix_bn=False if it has none)")
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=checkpoint_context(scope, policy, fix_bn))


# --------------------------------------------------------------------------------------------
# sqrt(n): a deep plain stack, checkpoint_sequential, and its BN-safe form
# --------------------------------------------------------------------------------------------
def checkpoint_segments(functions: nn.Sequential | Sequence[nn.Module], segments: int,
                        x: torch.Tensor, fix_bn: bool = True) -> torch.Tensor:
    """``torch.utils.checkpoint.checkpoint_sequential(functions, segments, x,
    use_reentrant=False)`` with the same split (``len // segments`` modules a segment, the rest
    in the last one, which runs without checkpointing: backward needs it first), but each
    segment's BatchNorms keep their running statistics while it is recomputed. Torch's own
    accepts no ``context_fn`` and so updates them twice."""
    mods = list(functions.children()) if isinstance(functions, nn.Sequential) else list(functions)
    if not 1 <= segments <= len(mods):
        raise ValueError(f"segments must be between 1 and {len(mods)} (the number of modules), "
                         f"got {segments}")
    size = len(mods) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        x = checkpointed(nn.Sequential(*mods[start:end]), x, fix_bn=fix_bn)
    for m in mods[end:]:
        x = m(x)
    return x


def deep_stack(n_layers: int, channels: int = 16, dims: int = 3) -> nn.Sequential:
    """``n_layers`` x (conv 3x3(x3) -> BN -> ReLU) at constant width: every layer's activations
    are the same size, the setting of Chen et al. (2016)."""
    conv, bn = (nn.Conv3d, nn.BatchNorm3d) if dims == 3 else (nn.Conv2d, nn.BatchNorm2d)
    layers: list[nn.Module] = []
    for _ in range(n_layers):
        layers.append(nn.Sequential(conv(channels, channels, 3, padding=1, bias=False),
                                    bn(channels), nn.ReLU(inplace=True)))
    return nn.Sequential(*layers)


class SegmentedStack(nn.Module):
    """Runs a ``deep_stack`` in ``segments`` checkpointed segments (0 = no checkpointing).
    The input layer lifts 1 channel to the stack's width.

    ``bn_safe=True`` (default) uses ``checkpoint_segments``; ``bn_safe=False`` uses torch's
    ``checkpoint_sequential`` as it is, which updates BatchNorm statistics twice (notebook 07
    shows it)."""

    def __init__(self, stack: nn.Sequential, segments: int = 0, in_channels: int = 1,
                 bn_safe: bool = True):
        super().__init__()
        width = stack[0][0].in_channels
        conv = type(stack[0][0])
        self.lift = conv(in_channels, width, 1)
        self.stack, self.segments, self.bn_safe = stack, segments, bn_safe
        self.head = conv(width, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x)
        if self.segments and torch.is_grad_enabled():
            if self.bn_safe:
                x = checkpoint_segments(self.stack, self.segments, x)
            else:
                x = checkpoint_sequential(self.stack, self.segments, x, use_reentrant=False)
        else:
            x = self.stack(x)
        return self.head(x)


def sqrt_fit(ns: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit ``value = k * sqrt(n) + c``; returns ``(k, c)``."""
    import numpy as np

    a = np.stack([np.sqrt(np.asarray(ns, dtype=float)), np.ones(len(ns))], axis=1)
    (k, c), *_ = np.linalg.lstsq(a, np.asarray(values, dtype=float), rcond=None)
    return float(k), float(c)


# --------------------------------------------------------------------------------------------
# Activation offload
# --------------------------------------------------------------------------------------------
def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class _OffloadedMeta:
    """What a simulated offload keeps of a saved tensor: its description, no device memory."""

    __slots__ = ("size", "stride", "dtype", "device", "offset")

    def __init__(self, t: torch.Tensor):
        self.size, self.stride, self.dtype = t.size(), t.stride(), t.dtype
        self.device, self.offset = t.device, t.storage_offset()


def _pack_simulated(t: torch.Tensor) -> Any:
    if not _is_fake(t):
        raise RuntimeError("the simulated offload is for predictions under FakeTensorMode only")
    if isinstance(t, nn.Parameter):
        return t  # a parameter stays where it is; save_on_cpu would copy it, but it is resident
    return _OffloadedMeta(t)


def _unpack_simulated(p: Any) -> torch.Tensor:
    if isinstance(p, torch.Tensor):
        return p
    # "copied back to the device": a new tensor of the same layout (values do not matter: fake)
    return torch.empty_strided(p.size, p.stride, dtype=p.dtype, device=p.device)


_SUSPENDED = [False]


@contextlib.contextmanager
def offload_suspended() -> Iterator[None]:
    """Inside, ``offload_saved`` does nothing: to count what offload would move (the saved bytes
    of the same step without it)."""
    old, _SUSPENDED[0] = _SUSPENDED[0], True
    try:
        yield
    finally:
        _SUSPENDED[0] = old


def offload_saved(example: torch.Tensor, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The context a training step's forward runs in to offload what autograd saves:

    * CUDA tensor: ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` -- each saved tensor is
      copied to pinned host memory in forward and back to the GPU when backward needs it;
    * a fake tensor (``FakeTensorMode``, the predictor): a simulation with the same effect on
      device memory -- autograd keeps only a description of each saved tensor, backward gets a
      freshly allocated one. A tensor that something else still references (a U-Net's skip
      connection, the current layer's input) stays on the device, as with ``save_on_cpu``;
    * a real CPU tensor: nothing (the activations already are in host memory).
    """
    if not enabled or _SUSPENDED[0]:
        return contextlib.nullcontext()
    if _is_fake(example):
        return torch.autograd.graph.saved_tensors_hooks(_pack_simulated, _unpack_simulated)
    if example.device.type == "cuda":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------------
# What a configuration costs in time: counted FLOPs and bytes, estimated seconds
# --------------------------------------------------------------------------------------------
def step_flops(build: Callable[[], nn.Module], input_shape: Sequence[int], *, n_classes: int = 5,
               backward: bool = True, dtype: torch.dtype = torch.float32,
               target_shape: Sequence[int] | None = None,
               loss_fn: Callable | None = None) -> int:
    """FLOPs of one step of ``build()`` on an input of ``input_shape``: forward, and with
    ``backward`` the backward pass too (recomputation included), counted by
    ``torch.utils.flop_counter.FlopCounterMode`` under ``FakeTensorMode`` (no data, any size).
    FlopCounterMode counts matrix multiplications and convolutions (2 FLOPs per multiply-add);
    element-wise ops (BN, ReLU) are not counted."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    # class indices and cross-entropy, or with target_shape floats and MSE (as predict_step)
    classify, target_shape, loss_fn = target_spec(tuple(input_shape), target_shape, None, loss_fn)
    with default_dtype(dtype), FakeTensorMode():
        model = build()
        x = torch.randn(tuple(input_shape))
        target = torch.randint(0, n_classes, target_shape) if classify else torch.randn(target_shape)
        with FlopCounterMode(display=False) as counter:
            if backward:
                loss_fn(model(x), target).backward()
            else:
                with torch.no_grad():
                    model(x)
    return int(counter.get_total_flops())


@dataclass
class RecomputeCount:
    """Counted FLOPs of a checkpointed step against the plain one."""

    forward: int  # FLOPs of the plain forward
    step: int  # FLOPs of the plain forward + backward
    step_checkpointed: int  # FLOPs of the checkpointed forward + backward

    @property
    def recomputed(self) -> int:
        return self.step_checkpointed - self.step

    @property
    def fraction_of_forward(self) -> float:
        """Recomputed FLOPs as a fraction of one forward pass (1.0 = "one extra forward")."""
        return self.recomputed / self.forward


def recompute_fraction(build_plain: Callable[[], nn.Module], build_checkpointed: Callable[[], nn.Module],
                       input_shape: Sequence[int], **kw) -> RecomputeCount:
    """Count (``step_flops``) how much of the forward pass a checkpointed variant runs again."""
    return RecomputeCount(
        forward=step_flops(build_plain, input_shape, backward=False, **kw),
        step=step_flops(build_plain, input_shape, **kw),
        step_checkpointed=step_flops(build_checkpointed, input_shape, **kw),
    )


#: Assumed throughputs for the time *estimates* (not measurements; change them for your GPU):
#: sustained dense fp16 tensor-core throughput of a mid-range GPU on convolutions, and PCIe
#: 4.0 x16 host<->device bandwidth per direction with pinned memory. The element-wise bytes are
#: left out (infinite bandwidth) unless ``memory_bytes_per_s`` is given.
ASSUMED_GPU_FLOPS = 50e12
ASSUMED_PCIE_BYTES_PER_S = 25e9


@dataclass
class StepCounts:
    """What one training step does, counted under ``FakeTensorMode`` (``step_counts``)."""

    flops: int  # FlopCounterMode: convolutions and matrix products, recomputation included
    elementwise_bytes: int  # cost.ElementwiseBytes: what the other ops read and write
    offloaded_bytes: int  # cost.SaveOnCpuMeter: every save of the forward, as save_on_cpu copies it


def step_counts(build: Callable[[], nn.Module], input_shape: Sequence[int], *, n_classes: int = 5,
                dtype: torch.dtype = torch.float32, autocast_dtype: torch.dtype | None = None) -> StepCounts:
    """One forward + backward of ``build()`` (no optimizer) on fake tensors, with CUDA's autocast
    rules when ``autocast_dtype`` is given, counting three things at once: the FLOPs
    (``FlopCounterMode``), the bytes of every other op (``cost.ElementwiseBytes``) and what
    ``torch.autograd.graph.save_on_cpu`` would copy to the host if it wrapped the model's forward
    (``cost.SaveOnCpuMeter``). save_on_cpu's ``pack_to_cpu`` copies **every** save into a new host
    tensor: a tensor two ops save is copied twice, and parameters are copied too -- unlike
    ``SavedTensorMeter``'s deduplicated ``saved_peak``. The model's own offload is suspended while
    counting (``offload_suspended``): the meter counts what it would move."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    _, target_shape, loss_fn = target_spec(tuple(input_shape), None, None, None)
    meter, traffic = SaveOnCpuMeter(), ElementwiseBytes()
    with offload_suspended(), default_dtype(dtype), FakeTensorMode(), \
            autocast_rules("cuda" if autocast_dtype else None):
        model = build()
        x = torch.randn(tuple(input_shape))
        target = torch.randint(0, n_classes, target_shape)
        meter.watch(model)
        with FlopCounterMode(display=False) as flops, traffic:
            training_step(model, x, target, None, loss_fn=loss_fn, autocast_dtype=autocast_dtype)
        del model, x, target
    return StepCounts(int(flops.get_total_flops()), traffic.total, meter.total)


@dataclass
class CostEstimate:
    """The extra time a memory-saving configuration costs per step, estimated on a CPU."""

    recomputed_flops: int
    offloaded_bytes: int  # what save_on_cpu copies to the host (and back): every save, once each
    gpu_flops: float = ASSUMED_GPU_FLOPS
    pcie_bytes_per_s: float = ASSUMED_PCIE_BYTES_PER_S
    elementwise_bytes: int = 0  # extra bytes the element-wise ops read and write (recomputed BN, ReLU...)
    memory_bytes_per_s: float = float("inf")  # device memory bandwidth (inf: element-wise work not counted)
    method: str = ("estimate: FLOPs counted by FlopCounterMode and element-wise bytes by "
                   "cost.ElementwiseBytes under FakeTensorMode, offloaded bytes as save_on_cpu copies "
                   "them (cost.SaveOnCpuMeter); seconds at assumed spec-sheet rates, not overlapped")

    @property
    def recompute_s(self) -> float:
        """Recomputed convolutions at ``gpu_flops`` plus the extra element-wise bytes at
        ``memory_bytes_per_s``."""
        return self.recomputed_flops / self.gpu_flops + max(self.elementwise_bytes, 0) / self.memory_bytes_per_s

    @property
    def transfer_s(self) -> float:
        """Both directions (to the host in forward, back in backward), not overlapped with
        compute: an upper bound for a step that cannot hide the copies."""
        return 2 * self.offloaded_bytes / self.pcie_bytes_per_s

    @property
    def extra_s(self) -> float:
        return self.recompute_s + self.transfer_s


def cost_estimate(build_plain: Callable[[], nn.Module], build: Callable[[], nn.Module],
                  input_shape: Sequence[int], *, offload: bool = False,
                  dtype: torch.dtype = torch.float32, n_classes: int = 5,
                  autocast_dtype: torch.dtype | None = None, plain: StepCounts | None = None,
                  **assumed) -> CostEstimate:
    """Estimated extra seconds per step of ``build`` over ``build_plain`` (``step_counts`` of
    both, the same precision): the recomputed FLOPs at ``gpu_flops`` (default
    ``ASSUMED_GPU_FLOPS``), the extra element-wise bytes at ``memory_bytes_per_s`` (default: not
    counted), and, with ``offload``, every save of ``build``'s forward copied to the host and back
    over PCIe at ``pcie_bytes_per_s`` (default ``ASSUMED_PCIE_BYTES_PER_S``). ``plain``
    (``step_counts(build_plain, ...)``) saves recounting the plain step for every variant."""
    kw = dict(dtype=dtype, n_classes=n_classes, autocast_dtype=autocast_dtype)
    plain = plain or step_counts(build_plain, input_shape, **kw)
    mine = step_counts(build, input_shape, **kw)
    return CostEstimate(recomputed_flops=max(mine.flops - plain.flops, 0),
                        offloaded_bytes=mine.offloaded_bytes if offload else 0,
                        elementwise_bytes=mine.elementwise_bytes - plain.elementwise_bytes, **assumed)


def frontier_table(configs: dict[str, dict[str, Any]], build: Callable[..., nn.Module],
                   input_shape: Sequence[int], *, plain: StepCounts | None = None,
                   peaks: dict[str, int] | None = None, autocast_dtype: torch.dtype | None = None,
                   n_classes: int = 5, progress: bool = False, **rates):
    """The memory-time frontier's table (notebook 07, section 7): for each configuration
    ``name -> build's keyword arguments``, the predicted steady-state peak (``peaks[name]`` if
    given, else ``predict_step``), the recomputed FLOPs and offloaded bytes counted, and the extra
    seconds estimated (``cost_estimate`` against ``build()`` at ``rates``; offload where the
    arguments set ``offload_activations``). A DataFrame indexed by configuration."""
    import pandas as pd
    from tqdm.auto import tqdm  # lazy: only a notebook's bar needs it

    kw_counts = dict(autocast_dtype=autocast_dtype, n_classes=n_classes)
    plain = plain or step_counts(build, input_shape, **kw_counts)
    rows = []
    for name, kw in tqdm(configs.items(), desc="frontier (predicted, counted)", disable=not progress):
        one = lambda kw=kw: build(**kw)  # noqa: E731
        peak = (peaks or {}).get(name)
        if peak is None:
            peak = predict_step(one, tuple(input_shape), n_classes=n_classes, autocast_dtype=autocast_dtype,
                                module_peaks=False).peak
        est = cost_estimate(build, one, input_shape, offload=kw.get("offload_activations", False), plain=plain,
                            **kw_counts, **rates)
        rows.append({"configuration": name, "peak MiB (predicted)": round(peak / 2**20),
                     "recomputed TFLOP (counted)": round(est.recomputed_flops / 1e12, 2),
                     "moved GiB each way (counted)": round(est.offloaded_bytes / 2**30, 2),
                     "extra s per step (estimate)": round(est.extra_s, 2)})
    return pd.DataFrame(rows).set_index("configuration")


def measure_offload_peaks(build: Callable[..., nn.Module], input_shape: Sequence[int], *, n_classes: int = 5,
                          autocast_dtype: torch.dtype | None = torch.float16) -> dict[str, Any]:
    """On a CUDA GPU: the measured peak (``max_memory_allocated``, MiB) of one forward + backward of
    ``build(offload_activations=flag)`` for flag False and True, under autocast; "OOM" for a
    variant that does not fit (the out-of-memory explained by ``catch_oom``)."""
    require_cuda("measure_offload_peaks")
    shape = tuple(input_shape)
    out: dict[str, Any] = {}
    for flag in (False, True):
        net = build(offload_activations=flag).cuda()
        x = torch.randn(shape, device="cuda")
        y = torch.randint(0, n_classes, (shape[0], *shape[2:]), device="cuda")

        def step(net=net, x=x, y=y):
            with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = net(x)
            nn.functional.cross_entropy(logits.float(), y).backward()

        with catch_oom() as r:
            out[f"offload={flag}"] = round(cuda_peak(step).peak_allocated / 2**20)
        if not r.ok:
            out[f"offload={flag}"] = "OOM"
        del net, x, y, step  # the next variant starts without this one's tensors
    return out


# --------------------------------------------------------------------------------------------
# Timing, done properly
# --------------------------------------------------------------------------------------------
def time_steps(builds: dict[str, Callable[[], nn.Module]], input_shape: Sequence[int], *,
               reps: int = 7, n_classes: int = 5, device: str | torch.device = "cpu",
               warmup: int = 1, seed: int = 0, progress: bool = False):
    """Measured seconds of one training step (forward, backward, Adam) per variant.

    Every variant is built once and warmed up; then ``reps`` rounds run each variant once, in
    turn (interleaved, so that a slow phase of a shared machine hits every variant alike). Per
    variant: the median, the minimum and the spread ``(max - min) / median`` of its repetitions;
    ``noise`` is the largest spread of any variant -- differences between medians smaller than
    it are not evidence. ``progress=True`` shows a tqdm bar over the rounds. Returns a pandas
    DataFrame (seconds)."""
    import pandas as pd
    from tqdm.auto import tqdm

    if reps < 3:
        raise ValueError(f"reps must be >= 3 for a median and a spread, got {reps}")
    dev = torch.device(device)
    torch.manual_seed(seed)
    x = torch.randn(tuple(input_shape), device=dev)
    y = torch.randint(0, n_classes, (input_shape[0], *input_shape[2:]), device=dev)
    runs = {}
    for name, build in builds.items():
        torch.manual_seed(seed)
        model = build().to(dev)
        runs[name] = (model, torch.optim.Adam(model.parameters()))

    def step(model, opt) -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    for model, opt in runs.values():
        for _ in range(warmup):
            step(model, opt)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in tqdm(range(reps), desc="timing rounds", unit="round", disable=not progress):
        for name, (model, opt) in runs.items():
            times[name].append(step(model, opt))
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"variant": name, "median s": med, "min s": min(ts),
                     "spread %": 100 * (max(ts) - min(ts)) / med, "reps": reps})
    df = pd.DataFrame(rows)
    base = df["median s"].iloc[0]
    df["vs first %"] = 100 * (df["median s"] / base - 1)
    df.attrs["noise %"] = float(df["spread %"].max())
    df.attrs["device"] = str(dev) + ("" if dev.type == "cuda" else
                                     f" ({torch.get_num_threads()} threads)")
    return df


def report_times(df, digits: int = 4):
    """``time_steps``' table for display: rounded, and "vs first %" replaced by "within noise"
    wherever the difference is smaller than the measured noise."""
    out = df.copy()
    noise = df.attrs.get("noise %", 0.0)
    out["vs first %"] = [f"{v:+.0f}" if abs(v) > noise else f"within noise (±{noise:.0f})"
                         for v in df["vs first %"]]
    for c in ("median s", "min s"):
        out[c] = out[c].round(digits)
    out["spread %"] = out["spread %"].round(0)
    return out


# --------------------------------------------------------------------------------------------
# Pictures and sweeps for notebooks 07 and 12 (and the capstone)
# --------------------------------------------------------------------------------------------
#: the stacked-bar categories, bottom to top, and what each is called on the plot
BAR_PARTS = (("Parameter", "parameters + buffers"), ("Gradient", "gradients"),
             ("Optstate", "optimizer state (Adam)"), ("Activation", "activations"),
             ("Temp", "temporaries"), ("Other", "other (input, target)"))


def plot_breakdowns(breakdowns: dict[str, dict[str, int]], ax=None, title: str = "",
                    budget_mib: float | None = None, budget_label: str = ""):
    """Stacked bars, one per technique, of a predicted peak split into parameters (+ buffers),
    gradients, optimizer state, activations, temporaries and other (``Prediction.breakdown``,
    bytes), in MiB; an optional horizontal budget line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.25 * len(breakdowns), 3.8))
    names = list(breakdowns)
    bottom = [0.0] * len(names)
    for i, (key, label) in enumerate(BAR_PARTS):  # one fixed colour per category
        vals = []
        for n in names:
            b = breakdowns[n]
            v = b.get(key, 0) + (b.get("Buffer", 0) if key == "Parameter" else 0)
            vals.append(v / 2**20)
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=label, color=f"C{i}")
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, top in enumerate(bottom):
        ax.text(i, top, f"{top:,.0f}", ha="center", va="bottom", fontsize=8)
    if budget_mib:
        ax.axhline(budget_mib, color="black", ls="--", lw=1)
        ax.text(-0.4, budget_mib, budget_label, ha="left", va="bottom", fontsize=8,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    ax.set_ylabel("MiB at the peak (predicted)")
    ax.set_ylim(0, max(bottom + [budget_mib or 0]) * 1.55)  # room for the legend above the bars
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend(fontsize=7, loc="upper right")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def hand_count(n: int, s: int) -> float:
    """Chen et al.'s count for ``n`` layers of two stored layer-sized tensors each (conv output,
    ReLU output), cut into ``s`` segments: the ``s - 1`` checkpointed segments keep their inputs,
    one segment (the last, which is not checkpointed, or the one being recomputed) keeps its
    ``2 n / s`` tensors. In units of one layer's output."""
    return (s - 1) + 2 * n / s


def sqrt_sweep(ns: Sequence[int] = (4, 8, 16, 32, 64), width: int = 4,
               shape: Sequence[int] = (1, 1, 8, 16, 16), progress: bool = False):
    """For each depth n: the predicted peak of the plain stack and of the best segment count
    among the divisors s of n within a factor 2 of sqrt(2n) (``SegmentedStack``, BN-safe), in
    units of one layer's output ``a``. Returns a DataFrame and ``a`` in bytes.

    Two columns say why the best peak's fit ``k sqrt(n) + c`` has a larger ``k`` than Chen et
    al.'s continuous optimum 2 sqrt(2): ``hand count / a``, ``min (s - 1) + 2 n / s`` over the same
    candidate s (``hand_count``: s must divide n), and ``parameters + buffers / a`` at the best
    peak, which grow linearly with n whatever the segment count. ``progress=True``: a tqdm bar
    over the depths."""
    import math

    import pandas as pd

    a = shape[0] * width * math.prod(shape[2:]) * 4

    def predict(n, s):
        return predict_step(lambda: SegmentedStack(deep_stack(n, width), s), tuple(shape),
                            n_classes=5, optimizer=None, module_peaks=False)

    if progress:
        from tqdm.auto import tqdm  # lazy: only a notebook asks for a bar

        ns = tqdm(ns, desc="sqrt(n) sweep (predicted)", unit="depth")
    rows = []
    for n in ns:
        root = math.sqrt(2 * n)
        cands = [s for s in range(1, n + 1) if n % s == 0 and root / 2 <= s <= 2 * root]
        preds = {s: predict(n, s) for s in cands}
        best = min(preds, key=lambda s: (preds[s].peak, s))
        b = preds[best].breakdown
        rows.append({"layers n": n, "segments tried": cands, "best s": best,
                     "checkpointed peak / a": preds[best].peak / a, "plain peak / a": predict(n, 0).peak / a,
                     "parameters + buffers / a": (b["Parameter"] + b["Buffer"]) / a,
                     "hand count / a": min(hand_count(n, s) for s in cands)})
    df = pd.DataFrame(rows)
    df.attrs["shape"] = tuple(shape)
    return df, a


def plot_sqrt_sweep(sweep, ax=None):
    """Peak (in layer outputs ``a``) against depth n: the plain stack (linear) and the best
    segment count, with the fitted ``k sqrt(n) + c``."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    n = sweep["layers n"].to_numpy()
    k, c = sqrt_fit(n, sweep["checkpointed peak / a"])
    grid = np.linspace(n.min(), n.max(), 200)
    ax.plot(n, sweep["plain peak / a"], "s-", color="grey", label="no checkpointing (predicted)")
    ax.plot(n, sweep["checkpointed peak / a"], "o", color="C0",
            label="best segment count (predicted)")
    ax.plot(grid, k * np.sqrt(grid) + c, "--", color="C0", label=f"fit {k:.2f} sqrt(n) + {c:.1f}")
    ax.set_xlabel("layers n")
    ax.set_ylabel("peak / one layer's output")
    ax.legend(fontsize=8, loc="upper left")
    return k, c


def peak_change_pct(peaks: dict[str, int], base: str = "none") -> dict[str, float]:
    """Each peak against ``peaks[base]``, in % (one decimal)."""
    return {k: round(100 * (v / peaks[base] - 1), 1) for k, v in peaks.items()}


def phase_peaks(prediction) -> dict[str, int]:
    """Live bytes at module boundaries, largest in the forward phase and in the backward phase
    (from the prediction's hook table), and the step's peak."""
    rows = prediction.log.rows
    first_bwd = next((i for i, r in enumerate(rows) if r.hook.startswith("bwd")), len(rows))
    fwd = max((r.tracked for r in rows[:first_bwd]), default=0)
    bwd = max((r.tracked for r in rows[first_bwd:]), default=0)
    return {"forward": fwd, "backward": bwd, "peak": prediction.peak}


# --------------------------------------------------------------------------------------------
# What the GPU runs recorded: the benchmark of seed 000's U-Net (docs/gpu-runs/)
# --------------------------------------------------------------------------------------------
#: the benchmark's techniques notebook 07 reads: its baseline and the options notebook 07 teaches
RECORDED_TECHNIQUES = ("baseline fp32", "checkpointing", "selective checkpointing", "In-Place ABN",
                       "offload to host", "autocast fp16 + lean Up + In-Place ABN + offload")


def recorded_benchmarks(net: str = "large", techniques: Sequence[str] | None = RECORDED_TECHNIQUES, folder=None):
    """Every GPU run's benchmark of seed 000's ``net`` (``docs/gpu-runs/*/benchmark-<net>.json`` and
    ``*/details/benchmark-<net>-*.json``, beside ``recorded.recorded_folder()``), one row per run
    and technique: the run (GPU, date, torch), the measured step time (median of the benchmark's
    repetitions) and its change against the run's ``baseline fp32`` row, the counted GFLOP and
    their change, and the batch-2 peak predicted and measured (``max_memory_allocated``) with
    measured / predicted (``techniques=None``: every technique recorded). A run whose record disowns its measured memory (``recorded.ONLY_STEP``:
    a failed attempt's graph stayed allocated) keeps its times and loses its measured peaks. A
    pandas DataFrame; empty if no run is recorded."""
    import pandas as pd

    rows = []
    for path, data in benchmark_records(net, folder):  # one that cannot be read: skipped, with a warning
        run = path.parent.parent.name if path.parent.name == "details" else path.parent.name
        meta = data["meta"]
        by_technique = {r.get("technique"): r for r in data["rows"] if r.get("net") == net}
        base = by_technique.get("baseline fp32")
        if base is None or base.get("step s") is None:
            continue
        for t in by_technique if techniques is None else techniques:
            r = by_technique.get(t)
            if r is None or r.get("step s") is None:
                continue
            measured = None if run in ONLY_STEP else r.get("measured peak MiB")
            rows.append({"run": f"{meta['device']}, {meta['date']}, torch {meta['torch']}", "technique": t,
                         "step s": r["step s"], "vs baseline %": round(100 * (r["step s"] / base["step s"] - 1), 1),
                         "GFLOP": r["GFLOP per step"],
                         "GFLOP vs baseline %": round(100 * (r["GFLOP per step"] / base["GFLOP per step"] - 1), 1),
                         "predicted peak MiB": r["predicted peak MiB"], "measured peak MiB": measured,
                         "measured / predicted": None if measured is None
                         else round(measured / r["predicted peak MiB"], 3)})
    return pd.DataFrame(rows)


guard(globals(), TechniqueError, zero=("segments",), signed=("elementwise_bytes",), infinite=("memory_bytes_per_s",))

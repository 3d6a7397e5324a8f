"""The memory explorer: every technique of the course as a switch, one predicted budget.

``estimate(Config(...))`` predicts the steady-state training memory of a U-Net configuration
per GPU and the largest batch that fits a card; ``explorer()`` puts it behind ipywidgets
controls with a stacked bar. How it stays fast enough to move a slider, and what it assumes:

* **One prediction per model configuration**, cached: the steady-state training step
  (``memory.predict_step``: Adam state resident, CUDA's autocast rules, 512-byte blocks) at
  batch 2. Parameters, gradients and optimizer state do not grow with the batch; activations,
  temporaries and the batch itself grow in proportion to it. ``tests/test_explorer.py`` checks
  the scaled figure against direct predictions at other batches.
* **What a card needs beyond the prediction** (``Overheads``): the CUDA context, which the
  allocator never sees, and slack for what the prediction cannot see -- cuDNN workspaces,
  allocator rounding and fragmentation (reserved above allocated). Defaults are assumptions
  stated in ``Overheads.source``; when a GPU run has been recorded (``recorded``), its measured
  context and reserved/allocated ratio replace them.
* **Data parallelism** (``dp_ranks`` > 1): each GPU holds the step of its share of the batch
  (the fullest rank's) plus DDP's gradient buckets, a flat copy of every gradient
  (``parallel.ddp_bucket_bytes``: DDP's default ``gradient_as_bucket_view=False``; measured in
  notebook 08). NCCL's own buffers are allocated outside PyTorch's allocator: like the CUDA
  context, they are not in the prediction (see notebook 08).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .checkpointing import save_convolutions
from .inplace_abn import inplace_abn
from .memory import GiB, MiB, predict_step
from .unet import UNet3D, bn_relu, bn_relu_inplace, default_channels

#: precision key -> (dtype of the model, autocast dtype or None). Code uses the keys;
#: widgets, ``Config.describe`` and plots show ``PRECISION_LABELS``.
PRECISIONS = {
    "fp32": (torch.float32, None),
    "fp16_model": (torch.float16, None),  # the model built in fp16, as seed 000 did
    "autocast_fp16": (torch.float32, torch.float16),
    "autocast_bf16": (torch.float32, torch.bfloat16),
}
PRECISION_LABELS = {"fp32": "fp32", "fp16_model": "fp16 model (seed 000)", "autocast_fp16": "autocast fp16",
                    "autocast_bf16": "autocast bf16"}
#: checkpointing key -> the UNet3D options it means
_CHECKPOINT_ARGS = {"none": {}, "level": {"checkpoint": "level"}, "double_conv": {"checkpoint": "double_conv"},
                    "conv": {"checkpoint": "conv"},
                    "selective": {"checkpoint": "level", "checkpoint_policy": save_convolutions}}
CHECKPOINTING = tuple(_CHECKPOINT_ARGS)  # ("none", "level", "double_conv", "conv", "selective")
CHECKPOINTING_LABELS = {"none": "none", "level": "every level", "double_conv": "every DoubleConv",
                        "conv": "every conv", "selective": "selective (save convs)"}
BUDGETS_GIB = (8, 12, 16, 24, 40, 80)
#: the batch each configuration is predicted at (BatchNorm needs 2 values per channel: a
#: 1-voxel deepest level at batch 1 would fail); other batches are scaled from it
PROBE_BATCH = 2
#: the parts of a peak that grow with the batch
PER_SAMPLE = ("activations", "temporaries")


@dataclass(frozen=True)
class Overheads:
    """Memory a card needs beyond the predicted ``max_memory_allocated``."""

    context_mib: float  # CUDA context + libraries: part of the card, never in memory_allocated
    slack: float  # fraction of the predicted peak: workspaces, rounding, fragmentation
    source: str

    def needed(self, predicted_peak: float) -> float:
        """Bytes of the card a step with this predicted allocated peak needs."""
        return predicted_peak * (1 + self.slack) + self.context_mib * MiB

    def usable(self, card_bytes: float) -> float:
        """The largest predicted allocated peak a card of ``card_bytes`` holds (``needed``'s inverse)."""
        return (card_bytes - self.context_mib * MiB) / (1 + self.slack)


def overheads() -> Overheads:
    """Measured on a GPU when a run was recorded, else the stated assumptions."""
    from .recorded import lookup

    ctx, ratio = lookup("00/cuda_context"), lookup("gpu/reserved_over_allocated")
    if ctx is not None and ratio is not None:
        return Overheads(float(ctx.value["context_MiB"]), max(0.0, float(ratio.value["max"]) - 1),
                         f"measured: context and reserved/allocated {ctx.label}")
    return Overheads(
        500.0, 0.10,
        "assumed (no GPU run recorded): CUDA context 500 MiB (a few hundred MiB on recent GPUs "
        "with lazy module loading); slack 10 % of the allocated peak (seed 000's own hook table "
        "shows reserved/allocated of 1.05-1.10 at its peaks)")


def _check_key(name: str, value: Any, labels: dict[str, str]) -> None:
    """Raise ValueError unless ``value`` is one of ``labels``' keys; a display label names its key."""
    if value in labels:
        return
    keys = {label: key for key, label in labels.items()}
    if value in keys:
        raise ValueError(f"{name}={value!r} is a display label, not a key: write {name}={keys[value]!r} "
                         f"(keys: {list(labels)})")
    raise ValueError(f"{name} must be one of {list(labels)}, got {value!r}")


#: the Config fields a cached prediction does not depend on: the batch and the ranks scale it,
#: the budget is compared with it. Every other field is part of ``Config.model_key``.
NOT_IN_MODEL_KEY = frozenset({"batch", "dp_ranks", "budget_gib"})
#: and the fields the counted FLOPs do not depend on besides (``_flops``): precision and the
#: activation switches change dtypes, in-place writes and where saved tensors live, not the
#: convolutions and matrix products FlopCounterMode counts
_NOT_IN_FLOPS_KEY = NOT_IN_MODEL_KEY | {"precision", "inplace_relu", "inplace_abn", "lean_up", "offload"}


@dataclass(frozen=True)
class Config:
    """One configuration of the explorer. ``precision`` is a key of ``PRECISIONS`` and
    ``checkpointing`` one of ``CHECKPOINTING`` (their labels: ``PRECISION_LABELS``,
    ``CHECKPOINTING_LABELS``)."""

    levels: int = 5
    base_channels: int = 64
    volume: tuple[int, int, int] = (26, 150, 320)
    batch: int = 2  # global batch
    precision: str = "fp16_model"
    inplace_relu: bool = False
    inplace_abn: bool = False
    checkpointing: str = "none"
    dp_ranks: int = 1
    budget_gib: int = 8
    seed000: bool = True  # at 64 channels, 5 or 4 levels: seed 000's exact large / small nets
    lean_up: bool = False  # Up casts the upsampled map to the skip's dtype at once (notebook 04)
    offload: bool = False  # saved activations go to host memory (save_on_cpu, notebook 07)

    def __post_init__(self):
        _check_key("precision", self.precision, PRECISION_LABELS)
        _check_key("checkpointing", self.checkpointing, CHECKPOINTING_LABELS)

    def _key(self, leave_out: frozenset[str]) -> tuple:
        return tuple((f.name, tuple(v) if isinstance(v := getattr(self, f.name), list) else v)
                     for f in fields(self) if f.name not in leave_out)

    def model_key(self) -> tuple:
        """What the cached predictions depend on: (name, value) of every field but
        ``NOT_IN_MODEL_KEY`` (batch, ranks, budget)."""
        return self._key(NOT_IN_MODEL_KEY)

    def describe(self) -> str:
        """The configuration in words, e.g. 'autocast fp16 + in-place ReLU + checkpointing every level'."""
        switches = ((self.lean_up, "lean Up"), (self.inplace_relu, "in-place ReLU"),
                    (self.inplace_abn, "In-Place ABN"))
        parts = [PRECISION_LABELS[self.precision]] + [name for on, name in switches if on]
        if self.checkpointing == "selective":
            parts.append("selective checkpointing (save convs)")
        elif self.checkpointing != "none":
            parts.append(f"checkpointing {CHECKPOINTING_LABELS[self.checkpointing]}")
        if self.offload:
            parts.append("offload to host")
        return " + ".join(parts)


def _validate(cfg: Config) -> None:
    """The combinations a valid Config cannot have (its keys are checked when it is made)."""
    if cfg.inplace_abn and cfg.checkpointing == "selective":
        raise ValueError(
            "selective checkpointing keeps each convolution's output, and In-Place ABN overwrites "
            "that output in place (PyTorch refuses: 'Tensor cached during selective activation "
            "checkpoint has been mutated'). Use full checkpointing (checkpointing='level') with In-Place ABN."
        )
    if cfg.inplace_abn and cfg.inplace_relu:
        raise ValueError("In-Place ABN replaces BatchNorm + ReLU: switch in-place ReLU off with it")
    if cfg.batch < 1 or cfg.dp_ranks < 1:
        raise ValueError("batch and dp_ranks must be >= 1")
    if cfg.budget_gib <= 0:
        raise ValueError(f"budget_gib must be > 0, got {cfg.budget_gib}")
    # a volume too small for the levels is reported by UNet3D.check_input itself


def build(cfg: Config) -> UNet3D:
    """The U-Net a configuration describes."""
    norm_act = inplace_abn if cfg.inplace_abn else (bn_relu_inplace if cfg.inplace_relu else bn_relu)
    ckpt = dict(_CHECKPOINT_ARGS[cfg.checkpointing], lean_up=cfg.lean_up, offload_activations=cfg.offload)
    if cfg.seed000 and cfg.base_channels == 64 and cfg.levels in (4, 5):
        from .unet import SEED000_VARIANTS

        variant = {5: "large", 4: "small"}[cfg.levels]
        return UNet3D(n_classes=5, **SEED000_VARIANTS[variant], norm_act=norm_act, **ckpt)
    return UNet3D(levels=cfg.levels, channels=default_channels(cfg.levels, cfg.base_channels),
                  n_classes=5, norm_act=norm_act, **ckpt)


#: the parts of a peak, from MemTracker's categories
PARTS = {"params": ("Parameter", "Buffer"), "grads": ("Gradient",), "optimizer": ("Optstate",),
         "activations": ("Activation",), "temporaries": ("Temp", "Other")}


@functools.lru_cache(maxsize=256)
def _probe(key: tuple) -> dict[str, Any]:
    """The configuration's steady-state step predicted at the probe batch: each part of the peak
    as (fixed bytes, bytes per sample), and the saved-for-backward bytes."""
    cfg = Config(**dict(key))
    dtype, ac = PRECISIONS[cfg.precision]
    p = predict_step(lambda: build(cfg), (PROBE_BATCH, 1, *cfg.volume), n_classes=5, dtype=dtype,
                     autocast_dtype=ac, module_peaks=False)
    parts = {k: sum(p.breakdown[c] for c in cats) for k, cats in PARTS.items()}
    lines = {k: (0.0, v / PROBE_BATCH) if k in PER_SAMPLE else (float(v), 0.0) for k, v in parts.items()}
    return {"lines": lines, "saved": p.saved_peak, "peak": p.peak, "kept": p.kept_after_forward,
            "location": p.log.peak_location}


def probe(cfg: Config) -> dict[str, Any]:
    """The configuration's step at the probe batch, as predicted once and cached: ``peak``,
    ``kept`` (activations after forward), ``saved`` (saved-for-backward bytes), ``location``
    (module and phase of the peak), ``lines`` (the parts of the peak per sample)."""
    _validate(cfg)
    return _probe(cfg.model_key())


def _lines(key: tuple) -> dict[str, tuple[float, float]]:
    return _probe(key)["lines"]


@dataclass
class Estimate:
    config: Config
    local_batch: int
    parts: dict[str, int]  # bytes per GPU: params, grads, optimizer, activations, temporaries (+ DDP buckets)
    largest_batch: int  # global batch that fits the budget on every GPU
    overheads: Overheads
    method: str = ("predicted (MemTracker under FakeTensorMode, steady-state step, CUDA rules; "
                   "batch-2 step scaled by the batch)")

    @property
    def total(self) -> int:
        """Predicted ``max_memory_allocated`` per GPU."""
        return sum(self.parts.values())

    @property
    def card_needs(self) -> int:
        """What the card must have: the prediction plus context and slack (``Overheads``)."""
        return int(self.overheads.needed(self.total))

    @property
    def fits(self) -> bool:
        return self.card_needs <= self.config.budget_gib * GiB

    def row(self) -> dict[str, Any]:
        """One table row; ``precision`` and ``checkpointing`` hold keys, so a row can be turned back
        into a Config (notebook 10)."""
        c = self.config
        return {"precision": c.precision, "lean Up": c.lean_up, "in-place ReLU": c.inplace_relu,
                "In-Place ABN": c.inplace_abn, "offload": c.offload,
                "checkpointing": c.checkpointing, "ranks": c.dp_ranks, "batch/GPU": self.local_batch,
                **{f"{k} MiB": round(v / MiB) for k, v in self.parts.items()},
                "total MiB": round(self.total / MiB), "card needs MiB": round(self.card_needs / MiB),
                f"largest batch in {c.budget_gib} GiB": self.largest_batch}


@functools.lru_cache(maxsize=256)
def _ddp_buckets(key: tuple) -> int:
    """DDP's gradient buckets on each rank for the configuration (``parallel.ddp_bucket_bytes``:
    one more copy of every gradient, in the parameters' dtype), counted on the meta device."""
    from .parallel.data_parallel import ddp_bucket_bytes

    cfg = Config(**dict(key))
    with torch.device("meta"):
        net = build(cfg).to(PRECISIONS[cfg.precision][0])
    return ddp_bucket_bytes(sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad))


def _parts(lines: dict[str, tuple[float, float]], batch: int) -> dict[str, int]:
    return {k: max(0, int(round(a + s * batch))) for k, (a, s) in lines.items()}


def estimate(cfg: Config, over: Overheads | None = None) -> Estimate:
    """Predicted steady-state memory per GPU for ``cfg`` (global batch split over dp_ranks), and
    the largest global batch whose step fits a ``budget_gib`` card on every rank."""
    _validate(cfg)
    over = over or overheads()
    lines = _lines(cfg.model_key())
    if cfg.dp_ranks > 1:  # DDP: its gradient buckets, held as long as the model (the whole step)
        lines = {**lines, "DDP buckets": (float(_ddp_buckets(cfg.model_key())), 0.0)}
    local = -(-cfg.batch // cfg.dp_ranks)  # ceil: the fullest rank
    budget = cfg.budget_gib * GiB
    per_sample = sum(s for _, s in lines.values())
    if per_sample <= 0:
        raise ValueError("the prediction does not grow with the batch: cannot size a batch")
    fixed = sum(a for a, _ in lines.values())
    # needed(b) = (fixed + b per_sample)(1 + slack) + context <= budget, solved for b
    room = over.usable(budget) - fixed
    largest = max(0, int(room // per_sample))
    while largest and over.needed(sum(_parts(lines, largest).values())) > budget:
        largest -= 1  # the rounding of each part
    return Estimate(cfg, local, _parts(lines, local), largest * cfg.dp_ranks, over)


def table(configs: list[Config]):
    import pandas as pd

    over = overheads()  # read the recorded figures once for the whole table
    return pd.DataFrame([estimate(c, over).row() for c in configs])


#: the checkpointing choices of notebooks 07 and 10's first table (finer ones: ``CHECKPOINTING``)
BASIC_CHECKPOINTING = ("none", "level", "selective")


def all_combinations(base: Config, precisions=None, lean_up=(False,), checkpointing=BASIC_CHECKPOINTING,
                     offload=(False,)) -> list[Config]:
    """Every valid combination of precision x activation trick x checkpointing (x lean Up and
    offload, for the values given), on ``base``. In-Place ABN with selective checkpointing is
    left out (they cannot be combined), and lean Up is only tried under autocast (elsewhere the
    upsampled map already has the skip's dtype). ``precisions`` and ``checkpointing`` are keys
    (``PRECISIONS``, ``CHECKPOINTING``)."""
    precisions = list(precisions or PRECISIONS)
    for prec in precisions:
        _check_key("precisions", prec, PRECISION_LABELS)
    for ck in checkpointing:
        _check_key("checkpointing", ck, CHECKPOINTING_LABELS)
    out = []
    for prec in precisions:
        for lean in lean_up:
            if lean and PRECISIONS[prec][1] is None:
                continue
            for relu, abn in ((False, False), (True, False), (False, True)):
                for ck in checkpointing:
                    if abn and ck == "selective":
                        continue
                    for off in offload:
                        out.append(replace(base, precision=prec, inplace_relu=relu, inplace_abn=abn,
                                           checkpointing=ck, lean_up=lean, offload=off))
    return out


# --------------------------------------------------------------------------------------------
# Time: what each configuration costs, estimated on a CPU (measured on a GPU by the benchmark)
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _flops(key: tuple) -> int:
    """FLOPs of one training step at the probe batch (forward, backward, recomputation)."""
    from .checkpointing import step_flops

    cfg = Config(**dict(key))  # the fields left out of the key keep their defaults
    return step_flops(lambda: build(cfg), (PROBE_BATCH, 1, *cfg.volume))


@dataclass(frozen=True)
class Cost:
    flops: int  # per step at the configuration's batch
    offloaded_bytes: int  # saved activations copied to the host and back
    seconds: float  # estimated: flops / gpu_flops + 2 x offloaded / pcie
    method: str


def step_cost(cfg: Config) -> Cost:
    """Estimated seconds per step on one GPU: the step's FLOPs (``FlopCounterMode`` under
    FakeTensorMode, recomputation included) at ``checkpointing.ASSUMED_GPU_FLOPS``, plus, with
    offload, the saved activations moved to the host and back at ``ASSUMED_PCIE_BYTES_PER_S``,
    not overlapped with compute. One throughput for every precision (tensor cores make 16-bit
    faster on a real GPU): the estimate ranks checkpointing and offload, not precisions."""
    from .checkpointing import ASSUMED_GPU_FLOPS, ASSUMED_PCIE_BYTES_PER_S

    _validate(cfg)
    local = -(-cfg.batch // cfg.dp_ranks)
    flops = _flops(cfg._key(_NOT_IN_FLOPS_KEY))
    flops = int(flops * local / PROBE_BATCH)
    moved = 0
    if cfg.offload:
        twin = _saved(replace(cfg, offload=False).model_key())
        moved = int(twin * local / PROBE_BATCH)
    secs = flops / ASSUMED_GPU_FLOPS + 2 * moved / ASSUMED_PCIE_BYTES_PER_S
    return Cost(flops, moved, secs,
                f"estimate: counted FLOPs at {ASSUMED_GPU_FLOPS / 1e12:.0f} TFLOP/s"
                + (f", host copies at {ASSUMED_PCIE_BYTES_PER_S / 1e9:.0f} GB/s" if cfg.offload else "")
                + " (assumed throughputs)")


def _saved(key: tuple) -> int:
    """Saved-for-backward bytes at the probe batch: what offloading would move."""
    return _probe(key)["saved"]


def pareto(points: list[tuple[float, float]]) -> list[bool]:
    """For (time, memory) points: True where no other point is at least as good in both and
    better in one (the memory-time frontier)."""
    return [not any((t2 <= t and m2 <= m) and (t2 < t or m2 < m) for t2, m2 in points)
            for t, m in points]


COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
          "temporaries": "#ccb974", "DDP buckets": "#dd8452", "context + slack": "#bbbbbb"}


def plot(est: Estimate, ax=None):
    """One stacked bar: what a GPU holds at the step's peak, with the card's size marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    left = 0.0
    parts = dict(est.parts, **{"context + slack": est.card_needs - est.total})
    for name, v in parts.items():
        ax.barh(0, v / MiB, left=left, color=COLORS[name], label=f"{name} {v / MiB:,.0f} MiB",
                hatch="//" if name == "context + slack" else None, edgecolor="white")
        left += v / MiB
    budget = est.config.budget_gib * 1024
    ax.axvline(budget, color="k", ls="--")
    ax.text(budget, 0.5, f"{est.config.budget_gib} GiB card ", ha="right", va="bottom", fontsize=8,
            transform=ax.get_xaxis_transform())
    ax.set_yticks([])
    ax.set_ylim(-0.5, 1.1)
    ax.set_xlim(0, max(left, budget) * 1.05)
    ax.set_xlabel("MiB per GPU (predicted steady-state step; grey: context + slack, see Overheads)")
    verdict = "fits" if est.fits else "does NOT fit"
    ax.set_title(f"{est.config.describe()}: batch {est.local_batch}/GPU {verdict}; largest global "
                 f"batch in {est.config.budget_gib} GiB: {est.largest_batch}", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper left", frameon=False)
    return ax


def explorer(start: Config = Config()):
    """The interactive explorer (ipywidgets); returns the widget box. A first prediction of a
    new model configuration takes two fake training steps (seconds on a laptop CPU at seed 000's
    size); batch, ranks and budget changes, and revisited configurations, are instant."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    s = start
    ctl = {
        "levels": w.IntSlider(s.levels, min=2, max=6, description="levels"),
        "base_channels": w.Dropdown(options=[8, 16, 32, 64], value=s.base_channels, description="channels"),
        "d": w.IntSlider(s.volume[0], min=8, max=128, step=2, description="D"),
        "h": w.IntSlider(s.volume[1], min=16, max=512, step=2, description="H"),
        "w": w.IntSlider(s.volume[2], min=16, max=512, step=2, description="W"),
        "batch": w.IntSlider(s.batch, min=1, max=64, description="batch"),
        "precision": w.Dropdown(options=[(label, key) for key, label in PRECISION_LABELS.items()],
                                value=s.precision, description="precision"),
        "inplace_relu": w.Checkbox(s.inplace_relu, description="in-place ReLU"),
        "lean_up": w.Checkbox(s.lean_up, description="lean Up"),
        "inplace_abn": w.Checkbox(s.inplace_abn, description="In-Place ABN"),
        "checkpointing": w.Dropdown(options=[(label, key) for key, label in CHECKPOINTING_LABELS.items()],
                                    value=s.checkpointing, description="checkpoint"),
        "dp_ranks": w.IntSlider(s.dp_ranks, min=1, max=8, description="DP ranks"),
        "budget_gib": w.Dropdown(options=list(BUDGETS_GIB), value=s.budget_gib, description="card GiB"),
    }
    out = w.Output()
    previous: dict[str, Estimate] = {}

    def update(_=None):
        cfg = Config(levels=ctl["levels"].value, base_channels=ctl["base_channels"].value,
                     volume=(ctl["d"].value, ctl["h"].value, ctl["w"].value), batch=ctl["batch"].value,
                     precision=ctl["precision"].value, inplace_relu=ctl["inplace_relu"].value,
                     inplace_abn=ctl["inplace_abn"].value, checkpointing=ctl["checkpointing"].value,
                     dp_ranks=ctl["dp_ranks"].value, budget_gib=ctl["budget_gib"].value, seed000=s.seed000,
                     lean_up=ctl["lean_up"].value)
        with out:
            out.clear_output(wait=True)
            try:
                est = estimate(cfg)
            except ValueError as err:
                print(err)
                return
            fig, ax = plt.subplots(figsize=(8, 2.2))
            plot(est, ax)
            plt.show()
            before = previous.get("last")
            if before is not None:
                delta = est.total - before.total
                print(f"change from the previous setting: {delta / MiB:+,.0f} MiB predicted peak"
                      + (" (no change: this switch does not touch the peak here; the peak is in "
                         f"{describe_peak(est)})" if abs(delta) < MiB else ""))
            print(f"overheads: {est.overheads.source}")
            previous["last"] = est

    for c in ctl.values():
        c.observe(update, names="value")
    # a static picture of the starting configuration, as a plain output: it stays readable in a
    # saved notebook, where the widget below shows nothing once the kernel is gone
    from IPython.display import Markdown

    display(Markdown("**The starting configuration, drawn once** (a static copy that survives "
                     "saving the notebook; the controls below are live while the kernel runs):"))
    fig, ax = plt.subplots(figsize=(8, 2.2))
    plot(estimate(start), ax)
    plt.show()
    update()
    rows = [w.HBox([ctl[k] for k in keys]) for keys in
            (("levels", "base_channels", "precision"), ("d", "h", "w"), ("batch", "dp_ranks", "budget_gib"),
             ("lean_up", "inplace_relu", "inplace_abn", "checkpointing"))]
    box = w.VBox(rows + [out])
    display(box)
    return box


def describe_peak(est: Estimate) -> str:
    """Where the peak of ``est``'s configuration is (module and phase), at the probe batch."""
    module, phase = probe(est.config)["location"]
    return f"{module}, {phase}"

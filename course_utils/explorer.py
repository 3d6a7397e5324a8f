"""The memory explorer: every technique of the course as a switch, one predicted budget.

``estimate(Config(...))`` predicts the steady-state training memory of a U-Net configuration
per GPU and the largest batch that fits a card; ``explorer()`` puts it behind ipywidgets
controls with a stacked bar. How it stays fast enough to move a slider, and what it assumes:

* **One prediction per model configuration**, cached: the steady-state training step
  (``memory.predict_step``: Adam state resident, CUDA's autocast rules, 512-byte blocks) at
  batch 2 (in a test session, shared by its processes: ``session_cache``). Parameters, gradients and optimizer state do not grow with the batch; activations,
  temporaries and the batch itself grow in proportion to it. ``tests/test_explorer.py`` checks
  the scaled figure against direct predictions at other batches.
* **What a card needs beyond the prediction** (``budget.Overheads``): the CUDA context, which the
  allocator never sees, and slack for what the prediction cannot see -- cuDNN workspaces,
  allocator rounding and fragmentation (reserved above allocated). Defaults are assumptions
  stated in ``Overheads.source``; when a GPU run has been recorded (``recorded``), its measured
  context replaces the assumed one (``overheads`` says why the slack stays assumed).
  ``budget.contexts()`` names the three contexts a budget can rest on (assumed, measured where
  recorded, the ~1.1 GiB seed 000's own numbers imply), and ``margin`` / ``margin_table`` say how
  much room a batch has under each and up to which context it still fits.
* **Data parallelism** (``dp_ranks`` > 1): each GPU holds the step of its share of the batch
  (the fullest rank's) plus DDP's gradient buckets, a flat copy of every gradient
  (``budget.ddp_bucket_bytes``: DDP's default ``gradient_as_bucket_view=False``; measured in
  notebook 08). NCCL's own buffers are allocated outside PyTorch's allocator: like the CUDA
  context, they are not in the prediction (see notebook 08).
* **Time** (``step_cost``), estimated for a named card (``cost.CARDS``: spec-sheet rates and their
  sources; ``DEFAULT_CARD``): the convolutions' counted FLOPs, the bytes the element-wise ops read
  and write (``ElementwiseBytes``) and, with offload, what ``save_on_cpu`` copies over PCIe and
  holds in pinned host memory; ``cost_table`` ranks configurations on every card.
* **Tables**: ``table`` gives five columns (configuration, card needs, largest batch, step time,
  method; ``columns="all"`` adds the switches and each part of the peak), at each configuration's
  batch or at its largest; ``choice_table`` sets a learner's choice beside the winner.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.utils._python_dispatch

from . import session_cache
from .amp_rules import autocast_rules
from .budget import Overheads, benchmark_context_mib, contexts, ddp_bucket_bytes, overheads
from .checkpointing import save_convolutions, step_flops
from .checks import TechniqueError, guard
from .cost import (
    CARDS,
    FLOPS_ONLY_50T,
    PRECISION_LABELS,
    PRECISIONS,
    Card,
    Cost,
    ElementwiseBytes,
    SaveOnCpuMeter,
    card,
)
from .inplace_abn import inplace_abn
from .memory import GiB, MiB, default_dtype, predict_step, prime_optimizer
from .recorded import benchmark_records
from .train import training_step
from .unet import SEED000_VARIANTS, UNet3D, bn_relu, bn_relu_inplace, default_channels

#: checkpointing key -> the UNet3D options it means
_CHECKPOINT_ARGS = {"none": {}, "level": {"checkpoint": "level"}, "double_conv": {"checkpoint": "double_conv"},
                    "conv": {"checkpoint": "conv"},
                    "selective": {"checkpoint": "level", "checkpoint_policy": save_convolutions}}
CHECKPOINTING = tuple(_CHECKPOINT_ARGS)  # ("none", "level", "double_conv", "conv", "selective")
CHECKPOINTING_LABELS = {"none": "none", "level": "every level", "double_conv": "every DoubleConv",
                        "conv": "every conv", "selective": "selective (save convs)"}
BUDGETS_GIB = (8, 12, 16, 24, 40, 80)
MAX_BUDGET_GIB = 1 << 16  # the largest budget a Config takes (64 TiB; no GPU today holds 0.3 TiB)
#: the batch each configuration is predicted at (BatchNorm needs 2 values per channel: a
#: 1-voxel deepest level at batch 1 would fail); other batches are scaled from it
PROBE_BATCH = 2
#: the parts of a peak that grow with the batch
PER_SAMPLE = ("activations", "temporaries")


def _check_key(name: str, value: Any, labels: dict[str, str]) -> None:
    """Raise TechniqueError unless ``value`` is one of ``labels``' keys; a display label names its key."""
    if isinstance(value, str) and value in labels:
        return
    keys = {label: key for key, label in labels.items()}
    if isinstance(value, str) and value in keys:
        raise TechniqueError(f"{name}={value!r} is a display label, not a key (keys: {list(labels)}).",
                             f"write {name}={keys[value]!r}.")
    raise TechniqueError(f"{name} must be one of {list(labels)}, got {value!r}.", f"pick {name} from {list(labels)}.")


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
        _check_sizes(self)

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


def _check_sizes(cfg: Config) -> None:
    """The numbers a Config relates (each is checked alone by ``guard``): a U-Net has at least two
    levels; the volume is three sides, each at least 2**(levels - 1) so the deepest level keeps a
    voxel; data parallelism has at least one rank."""
    if cfg.levels < 2:
        raise TechniqueError(f"Config(levels={cfg.levels}): a U-Net needs at least 2 levels (one pooling).",
                             "levels=2 or more (seed 000: 5).")
    volume = cfg.volume
    if isinstance(volume, (str, bytes)) or not isinstance(volume, (tuple, list)) or len(volume) != 3 or \
            any(isinstance(v, bool) or not isinstance(v, int) for v in volume):
        raise TechniqueError(f"Config(volume={volume!r}) is not three whole numbers (depth, height, width).",
                             "volume=(D, H, W), e.g. (26, 150, 320).")
    side = 2 ** (cfg.levels - 1)
    if min(volume) < side:
        raise TechniqueError(
            f"Config: volume {tuple(volume)} is too small for {cfg.levels} levels: each of D, H, W must be at "
            f"least 2**(levels-1) = {side} so that the deepest level keeps one voxel.",
            f"sides of {side} or more, or fewer levels.")
    if cfg.dp_ranks < 1:
        raise TechniqueError(f"Config(dp_ranks={cfg.dp_ranks}): data parallelism needs at least one rank.",
                             "dp_ranks=1 (one GPU) or more.")
    if not 1 <= cfg.budget_gib <= MAX_BUDGET_GIB:  # past any card, float rounding kept estimate's search going
        raise TechniqueError(f"Config(budget_gib={cfg.budget_gib}): no card holds that.", f"1 to {MAX_BUDGET_GIB} GiB.")


def _validate(cfg: Config) -> None:
    """The combinations a valid Config cannot have (its keys are checked when it is made)."""
    if cfg.inplace_abn and cfg.checkpointing == "selective":
        raise TechniqueError(
            "selective checkpointing keeps each convolution's output, and In-Place ABN overwrites "
            "that output in place (PyTorch refuses: 'Tensor cached during selective activation "
            "checkpoint has been mutated').", "use full checkpointing (checkpointing='level') with In-Place ABN.")
    if cfg.inplace_abn and cfg.inplace_relu:
        raise TechniqueError("In-Place ABN replaces BatchNorm + ReLU.", "switch in-place ReLU off with it.")
    # the sizes were checked when the Config was made (guard, _check_sizes)


def build(cfg: Config) -> UNet3D:
    """The U-Net a configuration describes."""
    norm_act = inplace_abn if cfg.inplace_abn else (bn_relu_inplace if cfg.inplace_relu else bn_relu)
    ckpt = dict(_CHECKPOINT_ARGS[cfg.checkpointing], lean_up=cfg.lean_up, offload_activations=cfg.offload)
    if cfg.seed000 and cfg.base_channels == 64 and cfg.levels in (4, 5):
        variant = {5: "large", 4: "small"}[cfg.levels]
        return UNet3D(n_classes=5, **SEED000_VARIANTS[variant], norm_act=norm_act, **ckpt)
    return UNet3D(levels=cfg.levels, channels=default_channels(cfg.levels, cfg.base_channels),
                  n_classes=5, norm_act=norm_act, **ckpt)


#: the parts of a peak, from MemTracker's categories
PARTS = {"params": ("Parameter", "Buffer"), "grads": ("Gradient",), "optimizer": ("Optstate",),
         "activations": ("Activation",), "temporaries": ("Temp", "Other")}


def _predict(cfg: Config, batch: int):
    """The configuration's steady-state step at ``batch`` (per GPU), predicted for a CUDA GPU."""
    dtype, ac = PRECISIONS[cfg.precision]
    return predict_step(lambda: build(cfg), (batch, 1, *cfg.volume), n_classes=5, dtype=dtype,
                        autocast_dtype=ac, module_peaks=False)


@functools.lru_cache(maxsize=256)
@session_cache.shared("explorer.probe")
def _probe(key: tuple) -> dict[str, Any]:
    """The configuration's steady-state step predicted at the probe batch: each part of the peak
    as (fixed bytes, bytes per sample), and the saved-for-backward bytes."""
    p = _predict(Config(**dict(key)), PROBE_BATCH)
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


def _per_sample_lines(key: tuple) -> dict[str, tuple[float, float]]:
    """Each part of the peak as a line in the batch, (bytes at batch 0, bytes per sample)."""
    return _probe(key)["lines"]


@dataclass
class Estimate:
    """``estimate``'s answer for a configuration: the predicted bytes per GPU by part, the largest
    global batch that fits the budget card, and the overheads the card must also hold."""

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
    """DDP's gradient buckets on each rank for the configuration (``budget.ddp_bucket_bytes``:
    one more copy of every gradient, in the parameters' dtype), counted on the meta device."""
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
    lines = _per_sample_lines(cfg.model_key())
    if cfg.dp_ranks > 1:  # DDP: its gradient buckets, held as long as the model (the whole step)
        lines = {**lines, "DDP buckets": (float(_ddp_buckets(cfg.model_key())), 0.0)}
    local = -(-cfg.batch // cfg.dp_ranks)  # ceil: the fullest rank
    budget = cfg.budget_gib * GiB
    per_sample = sum(s for _, s in lines.values())
    if per_sample <= 0:
        raise TechniqueError("the prediction does not grow with the batch: cannot size a batch.",
                             "check the configuration's volume and batch (activations grow with the batch).")
    fixed = sum(a for a, _ in lines.values())
    # needed(b) = (fixed + b per_sample)(1 + slack) + context <= budget, solved for b
    room = over.usable(budget) - fixed
    largest = max(0, int(room // per_sample))
    while largest and over.needed(sum(_parts(lines, largest).values())) > budget:
        largest -= 1  # the rounding of each part
    return Estimate(cfg, local, _parts(lines, local), largest * cfg.dp_ranks, over)


def _method(est: Estimate, gpu: str) -> str:
    """``table``'s method column: the batch the row is at, how its memory and time were found."""
    c = est.config
    at = f"batch {c.batch}" + (f" ({est.local_batch} / GPU on {c.dp_ranks} GPUs)" if c.dp_ranks > 1 else "")
    how = "predicted" if est.local_batch == PROBE_BATCH else f"predicted (scaled from {PROBE_BATCH})"
    return f"{at}: {how}; time est. for {gpu}"


def _row(cfg: Config, over: Overheads, columns: str, at_largest: bool) -> dict[str, Any]:
    if at_largest:  # at the largest batch the card holds, or 1 where none fits
        cfg = replace(cfg, batch=max(1, estimate(cfg, over).largest_batch))
    est, t = estimate(cfg, over), step_cost(cfg)
    row = {"configuration": cfg.describe(), "card needs MiB": round(est.card_needs / MiB),
           f"largest batch in {cfg.budget_gib} GiB": est.largest_batch, "step s": round(t.seconds, 2),
           "method": _method(est, t.card)}
    return row if columns == "short" else {**row, **est.row()}


def table(configs: list[Config], progress: bool = False, columns: str = "short", at_largest: bool = False):
    """One row per configuration, in the order given (the index is its position in ``configs``):

    * ``columns="short"``: configuration (``Config.describe``), what the card needs (the predicted
      peak + context + slack, ``Estimate.card_needs``), the largest batch that fits its
      ``budget_gib`` card, the estimated seconds per step (``step_cost`` on ``DEFAULT_CARD``) and
      the method (the row's batch, predicted or scaled, time estimated);
    * ``columns="all"``: those, then every column of ``Estimate.row`` (the switches as keys, so a
      row turns back into a Config; the ranks; each part of the peak).

    Each row is at its configuration's batch, or, with ``at_largest=True``, at the largest batch
    its card holds (batch 1 where none fits: its card needs then exceed the card).
    ``progress=True`` shows a tqdm progress bar (a widget in a notebook, text in a terminal): each
    new model configuration costs two fake-tensor training steps (memory, time), seconds each at
    seed 000's size on a loaded CPU."""
    import pandas as pd

    if columns not in ("short", "all"):
        raise TechniqueError(f"columns must be 'short' or 'all', got {columns!r}.", "columns='short' or 'all'.")
    over = overheads()  # read the recorded figures once for the whole table
    if progress:
        from tqdm.auto import tqdm

        configs = tqdm(configs, desc="configurations", unit="config")
    return pd.DataFrame([_row(c, over, columns, at_largest) for c in configs])


def choice_table(choice: dict[str, Any] | Config | None, base: Config, winner: Config):
    """The learner's ``choice`` beside the ``winner``, each at the largest batch its card holds:
    ``table``'s short columns with the predicted peak in place of the method, one row each ("your
    choice", "winner"; the winner alone while ``choice`` is None). ``choice`` is a Config, or a
    dict of Config fields applied to ``base`` (e.g. ``dict(precision="autocast_fp16",
    checkpointing="level")``)."""
    import pandas as pd

    rows = {}
    if choice is not None:
        if isinstance(choice, dict):
            names = {f.name for f in fields(Config)}
            unknown = sorted(set(choice) - names)
            if unknown:
                raise TechniqueError(f"my_choice: {unknown} are not fields of explorer.Config.",
                                     f"use {sorted(names - NOT_IN_MODEL_KEY)}.")
            choice = replace(base, **choice)
        rows["your choice"] = choice
    rows["winner"] = winner
    out = {}
    for name, c in rows.items():
        at = replace(c, batch=max(1, estimate(c).largest_batch))
        row = _row(at, overheads(), "short", at_largest=False)
        del row["method"]
        out[name] = {"configuration": row.pop("configuration"), "predicted peak MiB": round(direct_peak(at) / MiB),
                     **row}
    return pd.DataFrame.from_dict(out, orient="index")


@functools.lru_cache(maxsize=64)
@session_cache.shared("explorer.direct")
def _direct(key: tuple, batch: int) -> int:
    return _predict(Config(**dict(key)), batch).peak


def direct_peak(cfg: Config) -> int:
    """The steady-state step of ``cfg`` predicted at its own (per-GPU) batch, not scaled from the
    probe batch: the check of ``estimate``'s scaling where a margin is thin."""
    _validate(cfg)
    return _direct(cfg.model_key(), -(-cfg.batch // cfg.dp_ranks))


def margin(cfg: Config, over: Overheads | None = None) -> dict[str, Any]:
    """How close ``cfg`` (at its batch) is to not fitting its card under the overheads ``over``
    (default ``overheads()``): the context assumed and where it comes from, the usable bytes (the
    largest allocated peak the card holds), the predicted peak (``direct_peak``: at this batch,
    not scaled), what the card needs, the margin (card - needs; negative: it does not fit) in MiB
    and in % of the card, the largest batch (``estimate``), and the largest context at which
    ``cfg.batch`` still fits (context + margin). One table row, in MiB."""
    over = over or overheads()
    card_bytes = cfg.budget_gib * GiB
    peak = direct_peak(cfg)
    left = card_bytes - over.needed(peak)
    return {"context MiB": round(over.context_mib), "context source": over.source.split(":")[0],
            "slack %": round(100 * over.slack), "usable MiB": round(over.usable(card_bytes) / MiB),
            f"predicted peak at batch {cfg.batch} MiB": round(peak / MiB),
            "card needs MiB": round(over.needed(peak) / MiB), "margin MiB": round(left / MiB),
            "margin % of card": round(100 * left / card_bytes, 1),
            f"largest batch in {cfg.budget_gib} GiB": estimate(cfg, over).largest_batch,
            f"batch {cfg.batch} fits up to a context of MiB": round(over.context_mib + left / MiB)}


#: ``margin_table``'s columns (``margin``'s keys; the batch's and the card's filled in)
MARGIN_COLUMNS = ("context MiB", "margin MiB", "margin % of card", "largest batch in {gib} GiB",
                  "batch {batch} fits up to a context of MiB")


def margin_table(cfg: Config, assumptions: dict[str, Overheads] | None = None, columns: str = "short"):
    """``margin(cfg, over)`` for each of ``assumptions`` (by name; default: ``budget.contexts()``,
    the course's assumed context, a GPU recording's where there is one, and seed 000's): a pandas
    DataFrame, one row each, indexed by name. ``columns="short"``: ``MARGIN_COLUMNS``; ``"all"``:
    every key of ``margin``."""
    import pandas as pd

    if columns not in ("short", "all"):
        raise TechniqueError(f"columns must be 'short' or 'all', got {columns!r}.", "columns='short' or 'all'.")
    assumptions = assumptions or contexts()
    df = pd.DataFrame([margin(cfg, o) for o in assumptions.values()], index=list(assumptions))
    if columns == "all":
        return df
    return df[[c.format(gib=cfg.budget_gib, batch=cfg.batch) for c in MARGIN_COLUMNS]]


# --------------------------------------------------------------------------------------------
# What a GPU measured: the benchmark's recorded rows beside today's predictions
# --------------------------------------------------------------------------------------------
@dataclass
class RecordedBenchmark:
    """The newest benchmark of one of seed 000's nets recorded by a GPU run (``docs/gpu-runs/``):
    its ``meta`` (device, date, torch), the CUDA context its cap left out (``context_mib``: each
    largest batch was measured under an allocator cap of the card less it) and its ``rows``."""

    meta: dict[str, Any]
    context_mib: float | None
    rows: list[dict[str, Any]]

    @property
    def label(self) -> str:
        m = self.meta
        return f"{m['device']}, {m['date']}, torch {m['torch']}"


def recorded_benchmark(net: str = "large", runs_folder=None) -> RecordedBenchmark | None:
    """The newest (by date) benchmark of ``net`` with measured rows among the GPU runs' records
    (``recorded.runs_folder(runs_folder)``: the learner's zip ships them), or None."""
    found = []
    for _, data in benchmark_records(net, runs_folder):  # one that cannot be read: skipped, with a warning
        rows = [r for r in data["rows"] if r.get("measured peak MiB") is not None]
        if rows:
            found.append(RecordedBenchmark(data["meta"], benchmark_context_mib(data["meta"]), rows))
    return max(found, key=lambda b: b.meta["date"], default=None)


def benchmark_table(rec: RecordedBenchmark, configs: dict[str, Config], progress: bool = False):
    """What ``rec``'s GPU measured beside today's prediction, one row per technique of ``configs``
    (the benchmark's names -> Configs: ``benchmark.configs``) that ``rec`` holds: the largest batch
    in the card predicted under the context the GPU's cap left out (and the course's slack) and the
    one measured under that cap; the batch-2 peak predicted (``probe``) and measured
    (``max_memory_allocated``), and measured / predicted. A pandas DataFrame indexed by
    ``Config.describe()``. ``progress=True``: a tqdm bar (a configuration not predicted yet costs a
    fake-tensor step)."""
    import pandas as pd

    rows_in = rec.rows
    if progress:
        from tqdm.auto import tqdm

        rows_in = tqdm(rows_in, desc="recorded rows", unit="row")
    over = overheads()
    over = replace(over, context_mib=rec.context_mib, source=f"the context the GPU's cap left out ({rec.label})") \
        if rec.context_mib is not None else over
    rows = {}
    for r in rows_in:
        cfg = configs.get(r["technique"])
        if cfg is None:
            continue
        peak = probe(cfg)["peak"]  # the step predicted at the batch the benchmark measured (2)
        budget = f"in {cfg.budget_gib} GiB"
        rows[cfg.describe()] = {f"largest batch {budget}, predicted": estimate(cfg, over).largest_batch,
                                f"largest batch {budget}, measured": r[f"largest batch {budget} (measured)"],
                                "batch-2 peak predicted MiB": round(peak / MiB),
                                "batch-2 peak measured MiB": r["measured peak MiB"],
                                "measured / predicted": round(r["measured peak MiB"] * MiB / peak, 2)}
    return pd.DataFrame.from_dict(rows, orient="index")


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
@session_cache.shared("explorer.flops")
def _flops(key: tuple) -> int:
    """FLOPs of one training step at the probe batch (forward, backward, recomputation)."""
    cfg = Config(**dict(key))  # the fields left out of the key keep their defaults
    return step_flops(lambda: build(cfg), (PROBE_BATCH, 1, *cfg.volume))


@functools.lru_cache(maxsize=64)
@session_cache.shared("explorer.traffic")
def _traffic(key: tuple) -> dict[str, Any]:
    """One steady-state training step of the configuration (without offload), at the probe batch,
    under FakeTensorMode with CUDA's autocast rules and Adam's foreach update, as the prediction:
    the bytes its element-wise ops move (``ElementwiseBytes``, per op) and what ``save_on_cpu``
    would copy to the host in its forward (``SaveOnCpuMeter``: in all, and at most at once)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = Config(**dict(key))
    dtype, ac = PRECISIONS[cfg.precision]
    meter, counter = SaveOnCpuMeter(), ElementwiseBytes()
    with default_dtype(dtype), FakeTensorMode(), autocast_rules("cuda" if ac else None):
        model = build(replace(cfg, offload=False))
        x = torch.randn(PROBE_BATCH, 1, *cfg.volume)
        y = torch.randint(0, 5, (PROBE_BATCH, *cfg.volume))
        opt = torch.optim.Adam(model.parameters(), foreach=True)
        prime_optimizer(model, opt)
        meter.watch(model)
        with counter:
            training_step(model, x, y, opt, autocast_dtype=ac)
        del model, x, y, opt
    return {"elementwise": counter.total, "by_op": dict(counter.by_op), "packed": meter.total,
            "packed_peak": meter.peak}


def step_cost(cfg: Config, card_name: str | Card | None = None) -> Cost:
    """Estimated seconds per step on one GPU (``card_name``: a key of ``CARDS`` or a ``Card``;
    default ``DEFAULT_CARD``), three terms added, none overlapped with another:

    * the step's FLOPs (``FlopCounterMode`` under FakeTensorMode: convolutions, recomputation
      included) at the card's peak rate for the precision (``Card.flops``);
    * the bytes its other ops read and write (``ElementwiseBytes``: BatchNorm, ReLU, upsampling,
      concatenation, pooling, casts, Adam) at the card's memory bandwidth;
    * with offload, what ``save_on_cpu`` copies to the host and back, at the card's PCIe bandwidth.

    Peak rates make each term a lower bound; adding them (no overlap) is the pessimistic side."""
    _validate(cfg)
    gpu = card(card_name)
    local = -(-cfg.batch // cfg.dp_ranks)
    flops = int(_flops(cfg._key(_NOT_IN_FLOPS_KEY)) * local / PROBE_BATCH)
    traffic = _traffic(replace(cfg, offload=False).model_key())
    elementwise = int(traffic["elementwise"] * local / PROBE_BATCH)
    moved = pinned = 0
    if cfg.offload:
        moved = int(traffic["packed"] * local / PROBE_BATCH)
        pinned = int(traffic["packed_peak"] * local / PROBE_BATCH)
    compute_s, elementwise_s = flops / gpu.flops(cfg.precision), elementwise / gpu.memory_bytes_per_s
    transfer_s = 2 * moved / gpu.pcie_bytes_per_s
    return Cost(flops, moved, compute_s + elementwise_s + transfer_s,
                f"estimate for a {gpu.name}: counted FLOPs at {gpu.flops(cfg.precision) / 1e12:.1f} TFLOP/s"
                + (f", element-wise bytes at {gpu.memory_bytes_per_s / 1e9:.0f} GB/s"
                   if gpu.memory_bytes_per_s != float("inf") else ", element-wise work not counted")
                + (f", host copies at {gpu.pcie_bytes_per_s / 1e9:.2f} GB/s (PCIe {gpu.pcie})" if cfg.offload else "")
                + " (spec-sheet peaks, not overlapped)",
                elementwise, pinned, compute_s, elementwise_s, transfer_s, gpu.name)


def cost_table(configs: list[Config], cards=(*CARDS, FLOPS_ONLY_50T)):
    """Estimated seconds per step of each configuration on each card (``step_cost``) and each
    configuration's rank on each card (1 = fastest): whether the order of the configurations
    depends on the card. A pandas DataFrame, one row per configuration."""
    import pandas as pd

    rows = []
    for c in configs:
        row = {"configuration": c.describe()}
        for gpu in cards:
            row[f"{card(gpu).name} s"] = round(step_cost(c, gpu).seconds, 2)
        rows.append(row)
    df = pd.DataFrame(rows)
    for gpu in cards:
        name = card(gpu).name
        df[f"rank, {name}"] = df[f"{name} s"].rank(method="min").astype(int)
    return df


COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
          "temporaries": "#ccb974", "DDP buckets": "#dd8452", "context + slack": "#bbbbbb"}


#: the ``gid`` of the card's label in ``plot``'s figure (tests find it by this)
CARD_LABEL_GID = "card-label"


def plot(est: Estimate, ax=None):
    """One stacked bar: what a GPU holds at the step's peak, with the card's size marked: a dashed
    line, labelled above the bar (never on it), and the legend under the axes (never on the bar)."""
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
    # the bar spans y -0.4 .. 0.4: the label sits on top of it, left of the line
    ax.text(budget, 0.45, f"{est.config.budget_gib} GiB card ", ha="right", va="bottom", fontsize=8,
            gid=CARD_LABEL_GID)
    ax.set_yticks([])
    ax.set_ylim(-0.5, 1.1)
    ax.set_xlim(0, max(left, budget) * 1.05)
    ax.set_xlabel("MiB per GPU (predicted steady-state step; grey: context + slack, see Overheads)")
    verdict = "fits" if est.fits else "does NOT fit"
    c = est.config
    batch = f"batch {c.batch}" + (f" ({est.local_batch}/GPU on {c.dp_ranks} GPUs)" if c.dp_ranks > 1 else "")
    ax.set_title(f"{c.describe()}: {batch} {verdict}; largest global batch in {c.budget_gib} GiB: "
                 f"{est.largest_batch}", fontsize=9)
    # under the x label, four to a row: the figure keeps its width (a phone shrinks a wide one)
    ax.legend(fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(0, -0.36), frameon=False, borderaxespad=0)
    return ax


@dataclass
class ExplorerState:
    """What the explorer shows now (``explorer(...).explorer_state``): the controls, the last
    estimate and figure, and the lines printed under it; ``updates`` counts the re-estimates."""

    controls: dict[str, Any]
    estimate: Estimate | None = None
    figure: Any = None
    lines: list[str] | None = None
    updates: int = 0
    shown: Config | None = None  # the configuration the output shows (its figure or its error)
    update: Any = None  # the controls' callback (tests drive it as the widget front end would)


def _config_of(ctl: dict[str, Any], seed000: bool) -> Config:
    return Config(levels=ctl["levels"].value, base_channels=ctl["base_channels"].value,
                  volume=(ctl["d"].value, ctl["h"].value, ctl["w"].value), batch=ctl["batch"].value,
                  precision=ctl["precision"].value, inplace_relu=ctl["inplace_relu"].value,
                  inplace_abn=ctl["inplace_abn"].value, checkpointing=ctl["checkpointing"].value,
                  dp_ranks=ctl["dp_ranks"].value, budget_gib=ctl["budget_gib"].value, seed000=seed000,
                  lean_up=ctl["lean_up"].value)


def change_lines(est: Estimate, before: Estimate | None, changed: str | None) -> list[str]:
    """What the explorer prints under the figure after the control ``changed`` moved. The card's
    size is a budget, not a technique: it never changes the step's peak, so it is reported as what
    the step needs of the new card; a technique that leaves the peak where it was says where the
    peak is."""
    lines = []
    if before is not None:
        if changed == "budget_gib":
            c = est.config
            lines.append(f"card: {c.budget_gib} GiB. The step needs {est.card_needs / MiB:,.0f} MiB of it "
                         f"({'fits' if est.fits else 'does not fit'}); the largest global batch on this card: "
                         f"{est.largest_batch}")
        else:
            delta = est.total - before.total
            line = f"change from the previous setting: {delta / MiB:+,.0f} MiB predicted peak"
            if abs(delta) < MiB:
                line += f" (this switch leaves the peak where it is: in {describe_peak(est)})"
            lines.append(line)
    lines.append(f"overheads: {est.overheads.source}")
    return lines


def explorer(start: Config = Config()):
    """The interactive explorer (ipywidgets); returns the widget box (its ``explorer_state``: what
    it shows). A first prediction of a new model configuration takes two fake training steps
    (seconds on a CPU at seed 000's size); batch, ranks and budget changes, and revisited
    configurations, are instant. The sliders update when released (``continuous_update=False``):
    dragging the batch from 2 to 9 is one estimate, not seven queued ones that leave the figure
    behind the slider."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    s = start
    slider = functools.partial(w.IntSlider, continuous_update=False)
    ctl = {
        "levels": slider(s.levels, min=2, max=6, description="levels"),
        "base_channels": w.Dropdown(options=[8, 16, 32, 64], value=s.base_channels, description="channels"),
        "d": slider(s.volume[0], min=8, max=128, step=2, description="D"),
        "h": slider(s.volume[1], min=16, max=512, step=2, description="H"),
        "w": slider(s.volume[2], min=16, max=512, step=2, description="W"),
        "batch": slider(s.batch, min=1, max=64, description="batch"),
        "precision": w.Dropdown(options=[(label, key) for key, label in PRECISION_LABELS.items()],
                                value=s.precision, description="precision"),
        "inplace_relu": w.Checkbox(s.inplace_relu, description="in-place ReLU"),
        "lean_up": w.Checkbox(s.lean_up, description="lean Up"),
        "inplace_abn": w.Checkbox(s.inplace_abn, description="In-Place ABN"),
        "checkpointing": w.Dropdown(options=[(label, key) for key, label in CHECKPOINTING_LABELS.items()],
                                    value=s.checkpointing, description="checkpoint"),
        "dp_ranks": slider(s.dp_ranks, min=1, max=8, description="DP ranks"),
        "budget_gib": w.Dropdown(options=list(BUDGETS_GIB), value=s.budget_gib, description="card GiB"),
    }
    names = {id(c): k for k, c in ctl.items()}
    out = w.Output()
    state = ExplorerState(ctl)

    def update(change=None):
        # the controls' values now, not the event's: an event queued behind a slow estimate is
        # drawn with the latest values, so the figure never shows a batch the slider has left
        try:
            cfg = _config_of(ctl, s.seed000)
        except TechniqueError as err:  # e.g. a volume too small for the levels: said, not raised
            with out:
                out.clear_output(wait=True)
                state.shown = None
                print(err)
            return
        if cfg == state.shown:
            return  # already shown (a queued event of a setting since reached)
        changed = names.get(id(change["owner"])) if change else None
        with out:
            out.clear_output(wait=True)
            state.shown = cfg
            try:
                est = estimate(cfg)
            except ValueError as err:
                print(err)
                return
            if state.figure is not None:
                plt.close(state.figure)
            fig, ax = plt.subplots(figsize=(8, 2.2))
            plot(est, ax)
            state.figure = fig
            plt.show()
            state.lines = change_lines(est, state.estimate, changed)
            print("\n".join(state.lines))
            state.estimate = est
            state.updates += 1

    state.update = update
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
    box.explorer_state = state
    display(box)
    return box


def describe_peak(est: Estimate) -> str:
    """Where the peak of ``est``'s configuration is (module and phase), at the probe batch."""
    module, phase = probe(est.config)["location"]
    return f"{module}, {phase}"


guard(globals(), TechniqueError)

"""The memory explorer: every technique of the course as a switch, one predicted budget.

``estimate(Config(...))`` predicts the steady-state training memory of a U-Net configuration
per GPU; ``explorer()`` puts it behind ipywidgets sliders with a stacked bar and the largest batch
for a budget. How it stays fast enough to drag a slider:

* one ``predict_step`` (forward + backward under FakeTensorMode, no optimizer) per *model*
  configuration, at batch 1, cached;
* the batch enters linearly: every activation and temporary has a batch dimension, parameters and
  gradients do not (``tests/test_explorer.py`` checks the scaling against direct predictions);
* Adam's two moments are added analytically (2 x the parameter bytes, in the parameters' dtype):
  from the second step on they are resident during forward and backward, so this is the
  *steady-state* peak, not the first step's. The optimizer step's own temporaries are ignored.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch

from .checkpointing import save_convolutions
from .inplace_abn import inplace_abn
from .memory import GiB, MiB, predict_step
from .unet import UNet3D, bn_relu, bn_relu_inplace, default_channels

PRECISIONS = {
    "fp32": (torch.float32, None),
    "fp16 model (seed 000)": (torch.float16, None),
    "autocast fp16": (torch.float32, torch.float16),
    "autocast bf16": (torch.float32, torch.bfloat16),
}
CHECKPOINTING = ("none", "every level", "selective (save convs)")
BUDGETS_GIB = (8, 16, 24, 80)


@dataclass(frozen=True)
class Config:
    levels: int = 5
    base_channels: int = 64
    volume: tuple[int, int, int] = (26, 150, 320)
    batch: int = 2  # global batch
    precision: str = "fp16 model (seed 000)"
    inplace_relu: bool = False
    inplace_abn: bool = False
    checkpointing: str = "none"
    dp_ranks: int = 1
    budget_gib: int = 8
    seed000: bool = True  # at 64 channels, 5 or 4 levels: seed 000's exact large / small nets

    def model_key(self) -> tuple:
        """What the cached prediction depends on (not batch, ranks or budget)."""
        return (self.levels, self.base_channels, self.volume, self.precision, self.inplace_relu,
                self.inplace_abn, self.checkpointing, self.seed000)


def _validate(cfg: Config) -> None:
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {cfg.precision!r}")
    if cfg.checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {list(CHECKPOINTING)}, got {cfg.checkpointing!r}")
    if cfg.inplace_abn and cfg.checkpointing.startswith("selective"):
        raise ValueError(
            "selective checkpointing keeps each convolution's output, and In-Place ABN overwrites "
            "that output in place (PyTorch refuses: 'Tensor cached during selective activation "
            "checkpoint has been mutated'). Use full checkpointing ('every level') with In-Place ABN."
        )
    if cfg.batch < 1 or cfg.dp_ranks < 1:
        raise ValueError("batch and dp_ranks must be >= 1")
    # a volume too small for the levels is reported by UNet3D.check_input itself


def build(cfg: Config) -> UNet3D:
    """The U-Net a configuration describes."""
    norm_act = inplace_abn if cfg.inplace_abn else (bn_relu_inplace if cfg.inplace_relu else bn_relu)
    ckpt = dict(checkpoint_levels=cfg.checkpointing != "none",
                checkpoint_policy=save_convolutions if cfg.checkpointing.startswith("selective") else None)
    if cfg.seed000 and cfg.base_channels == 64 and cfg.levels in (4, 5):
        from .unet import SEED000_VARIANTS

        variant = {5: "large", 4: "small"}[cfg.levels]
        return UNet3D(n_classes=5, **SEED000_VARIANTS[variant], norm_act=norm_act, **ckpt)
    return UNet3D(levels=cfg.levels, channels=default_channels(cfg.levels, cfg.base_channels),
                  n_classes=5, norm_act=norm_act, **ckpt)


@functools.lru_cache(maxsize=256)
def _per_sample(key: tuple) -> dict[str, int]:
    cfg = Config(levels=key[0], base_channels=key[1], volume=key[2], precision=key[3],
                 inplace_relu=key[4], inplace_abn=key[5], checkpointing=key[6], seed000=key[7])
    dtype, ac = PRECISIONS[cfg.precision]
    p = predict_step(lambda: build(cfg), (1, 1, *cfg.volume), n_classes=5, dtype=dtype,
                     optimizer=None, autocast_dtype=ac, module_peaks=False)
    b = p.breakdown
    return {"params": b["Parameter"] + b["Buffer"], "grads": b["Gradient"],
            "per_sample": b["Activation"] + b["Temp"] + b["Other"],
            "activations_per_sample": b["Activation"], "param_bytes": b["Parameter"]}


@dataclass
class Estimate:
    config: Config
    local_batch: int
    parts: dict[str, int]  # bytes per GPU: params, grads, optimizer, activations, temporaries
    largest_batch: int  # global batch that fits the budget on every GPU
    method: str = "predicted (MemTracker under FakeTensorMode, batch-1 run scaled; Adam analytic)"

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def row(self) -> dict[str, Any]:
        c = self.config
        return {"precision": c.precision, "in-place ReLU": c.inplace_relu, "In-Place ABN": c.inplace_abn,
                "checkpointing": c.checkpointing, "ranks": c.dp_ranks, "batch/GPU": self.local_batch,
                **{f"{k} MiB": round(v / MiB) for k, v in self.parts.items()},
                "total MiB": round(self.total / MiB),
                f"largest batch in {c.budget_gib} GiB": self.largest_batch}


def estimate(cfg: Config) -> Estimate:
    """Predicted steady-state memory per GPU for ``cfg`` (global batch split over dp_ranks)."""
    _validate(cfg)
    s = _per_sample(cfg.model_key())
    local = -(-cfg.batch // cfg.dp_ranks)  # ceil: the fullest rank
    act = s["activations_per_sample"] * local
    static = s["params"] + s["grads"] + 2 * s["param_bytes"]
    parts = {"params": s["params"], "grads": s["grads"], "optimizer": 2 * s["param_bytes"],
             "activations": act, "temporaries": s["per_sample"] * local - act}
    room = cfg.budget_gib * GiB - static
    largest = max(0, room // s["per_sample"]) * cfg.dp_ranks if s["per_sample"] else 0
    return Estimate(cfg, local, parts, int(largest))


def table(configs: list[Config]):
    import pandas as pd

    return pd.DataFrame([estimate(c).row() for c in configs])


def all_combinations(base: Config, precisions=None) -> list[Config]:
    """Every valid combination of precision x activation trick x checkpointing, on ``base``
    (In-Place ABN with selective checkpointing is left out: they cannot be combined)."""
    out = []
    for prec in precisions or PRECISIONS:
        for relu, abn in ((False, False), (True, False), (False, True)):
            for ck in CHECKPOINTING:
                if abn and ck.startswith("selective"):
                    continue
                out.append(replace(base, precision=prec, inplace_relu=relu, inplace_abn=abn, checkpointing=ck))
    return out


def plot(est: Estimate, ax=None):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.8))
    left = 0.0
    colors = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"]
    for (name, v), col in zip(est.parts.items(), colors):
        ax.barh(0, v / MiB, left=left, color=col, label=f"{name} {v / MiB:,.0f}")
        left += v / MiB
    budget = est.config.budget_gib * 1024
    ax.axvline(budget, color="k", ls="--")
    ax.text(budget, 0.45, f" {est.config.budget_gib} GiB", va="center")
    ax.set_yticks([])
    ax.set_xlim(0, max(left, budget) * 1.15)
    ax.set_xlabel("MiB per GPU (predicted)")
    ax.set_title(f"{est.total / MiB:,.0f} MiB at batch {est.local_batch}/GPU -> "
                 f"largest global batch in budget: {est.largest_batch}", fontsize=10)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.55))
    return ax


def explorer(start: Config = Config()):
    """The interactive explorer (ipywidgets); returns the widget box. A first prediction of a
    new model configuration takes about a second on a laptop CPU; batch, ranks and budget
    changes, and revisited configurations, are instant."""
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
        "precision": w.Dropdown(options=list(PRECISIONS), value=s.precision, description="precision"),
        "inplace_relu": w.Checkbox(s.inplace_relu, description="in-place ReLU"),
        "inplace_abn": w.Checkbox(s.inplace_abn, description="In-Place ABN"),
        "checkpointing": w.Dropdown(options=list(CHECKPOINTING), value=s.checkpointing, description="checkpoint"),
        "dp_ranks": w.IntSlider(s.dp_ranks, min=1, max=8, description="DP ranks"),
        "budget_gib": w.Dropdown(options=list(BUDGETS_GIB), value=s.budget_gib, description="budget GiB"),
    }
    out = w.Output()

    def update(_=None):
        cfg = Config(levels=ctl["levels"].value, base_channels=ctl["base_channels"].value,
                     volume=(ctl["d"].value, ctl["h"].value, ctl["w"].value), batch=ctl["batch"].value,
                     precision=ctl["precision"].value, inplace_relu=ctl["inplace_relu"].value,
                     inplace_abn=ctl["inplace_abn"].value, checkpointing=ctl["checkpointing"].value,
                     dp_ranks=ctl["dp_ranks"].value, budget_gib=ctl["budget_gib"].value, seed000=s.seed000)
        with out:
            out.clear_output(wait=True)
            try:
                est = estimate(cfg)
            except ValueError as err:
                print(err)
                return
            fig, ax = plt.subplots(figsize=(8, 1.9))
            plot(est, ax)
            plt.show()

    for c in ctl.values():
        c.observe(update, names="value")
    update()
    rows = [w.HBox([ctl[k] for k in keys]) for keys in
            (("levels", "base_channels", "precision"), ("d", "h", "w"), ("batch", "dp_ranks", "budget_gib"),
             ("inplace_relu", "inplace_abn", "checkpointing"))]
    box = w.VBox(rows + [out])
    display(box)
    return box


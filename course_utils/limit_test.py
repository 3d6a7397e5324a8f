"""Seed 003: the 3D memory-limit test, Conv3d 1 -> 4 -> 8 -> 1 with ReLU and MSE on an N^3 cube.

The seed's naive estimate: 4 + 8 + 1 = 13 conv outputs and as many ReLU outputs, each the size of
the input, so 26 x the input. PyTorch does better than "keep everything": a ReLU saves its
*output* (the conv output before it is freed at once), so autograd keeps the input, the three ReLU
outputs (4 + 8 + 1 = 13 input-sizes) and the target -- 15 x the input, not 26 x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import recorded
from .checks import RecordError, TechniqueError, guard
from .files import skipped
from .memory import MiB, SavedTensor, largest_that_fits, measure_step, predict_step, require_cuda, storage_key

#: Seed 003's measurements (MB as read off nvidia-smi, CUDA context included): N -> (forward,
#: backward); None = the run failed (OOM, or cuDNN had no 3D backward algorithm at that size).
SEED003_TORCH: dict[int, tuple[float | None, float | None]] = {
    50: (134, 4), 64: (150, 10), 100: (218, 52), 128: (324, 110), 200: (1090, 230),
    256: (2180, None), 300: (3448, None), 350: (5438, None), 400: (None, None),
}
SEED003_CHAINER: dict[int, tuple[float | None, float | None]] = {
    50: (118, 8), 64: (134, 8), 100: (196, 8), 128: (290, 60), 200: (808, 230),
    256: (1592, None), 300: (2500, None), 400: (5824, None), 450: (6886, None), 500: (None, None),
}
#: the seed's ratio forward / (26 x input) for torch at large N, and chainer's best.
SEED003_TORCH_RATIO = (1.2, 1.5)
SEED003_CHAINER_RATIO = 0.88
#: the seed's GPU: it ran out at N=400 (torch), i.e. about 8 GB.
SEED003_BUDGET_GIB = 8
#: the seed's "Variables" (MB read off nvidia-smi) at N = 350 and, for its out-of-memory run, at
#: N = 400: the input and the target on the GPU (2 x 4 N^3 bytes: 327 and 488 MiB)
SEED003_VARIABLES_MB = {350: 320, 400: 480}


class LimitTestNet(nn.Sequential):
    """Conv3d(1,4) -> ReLU -> Conv3d(4,8) -> ReLU -> Conv3d(8,1) -> ReLU; 3x3x3 kernels, padding 1
    (the seed does not give the kernel size; padding keeps the output N^3 like the target)."""

    def __init__(self, inplace: bool = False):
        super().__init__(
            nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(inplace=inplace),
            nn.Conv3d(4, 8, 3, padding=1), nn.ReLU(inplace=inplace),
            nn.Conv3d(8, 1, 3, padding=1), nn.ReLU(inplace=inplace),
        )


def input_bytes(n: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one N^3 volume (batch 1, 1 channel)."""
    return n**3 * torch.empty((), dtype=dtype).element_size()


def naive_bytes(n: int, dtype: torch.dtype = torch.float32) -> int:
    """The seed's naive estimate: 26 x the input (13 conv outputs + 13 ReLU outputs)."""
    return 26 * input_bytes(n, dtype)


def expected_saved_bytes(n: int, dtype: torch.dtype = torch.float32) -> int:
    """What autograd keeps for backward: input + ReLU outputs (4 + 8 + 1) + MSE target = 15 x."""
    return (1 + 4 + 8 + 1 + 1) * input_bytes(n, dtype)


def make_inputs(n: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """The seed's batch: input and target of shape [1, 1, N, N, N]."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    shape = (1, 1, n, n, n)
    return (torch.randn(shape, device=device, dtype=dtype),
            torch.randn(shape, device=device, dtype=dtype))


@dataclass
class LimitRun:
    """One memory-limit run at cube size N (bytes)."""

    n: int
    after_forward: int  # live bytes when the model's forward returns: weights, input, target, intermediates
    peak: int  # the step's peak, backward included
    saved: int  # saved-for-backward bytes
    method: str
    #: bytes the model's forward added (live bytes when it returns minus when it starts): the
    #: intermediates kept for backward, like for like with the seed's "Forward" column, which
    #: it read off nvidia-smi on top of the network and the variables (input and target)
    forward_added: int = 0

    def row(self, show_all: bool = False) -> dict:
        """One table row in MiB: N, after forward, forward added, peak, after forward / naive 26 x;
        ``show_all=True`` adds the input, the saved bytes and the method."""
        row = {"N": self.n, "after forward MiB": round(self.after_forward / MiB, 1),
               "forward added MiB": round(self.forward_added / MiB, 1),
               "peak MiB": round(self.peak / MiB, 1),
               "forward / naive 26x": round(self.after_forward / naive_bytes(self.n), 2)}
        if show_all:
            row.update({"input MiB": round(input_bytes(self.n) / MiB, 1), "saved MiB": round(self.saved / MiB, 1),
                        "method": self.method})
        return row


def run_limit_test(n: int, device: str | torch.device | None = None, fake: bool = True,
                   dtype: torch.dtype = torch.float32) -> LimitRun:
    """Seed 003's step at cube size ``n``: forward, MSE, backward (no optimizer, as in the seed),
    the course's ``training_step`` in every case.

    * ``device='cuda'``: measured with the CUDA allocator (``memory_allocated`` when the forward
      returns, ``max_memory_allocated`` over the step; ``memory.measure_step``).
    * otherwise: predicted for a CUDA GPU under FakeTensorMode (``fake=True``, any N in
      milliseconds), or measured with MemTracker on real CPU tensors (``fake=False``).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ValueError(f"N must be a whole number >= 3 (a 3x3x3 convolution's cube), got {n!r}")
    shape = (1, 1, n, n, n)
    if device is not None and torch.device(device).type == "cuda":
        require_cuda("run_limit_test(device='cuda')")
        m = measure_step(LimitTestNet, shape, shape, dtype=dtype, optimizer=None,
                         steady_state=False, device=device)
        return LimitRun(n, m.allocated_after_forward, m.peak_allocated, m.saved_peak,
                        "measured (cuda allocator)", m.kept_after_forward)
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"device must be 'cuda', 'cpu' or None, got {device!r}")
    pred = predict_step(LimitTestNet, shape, shape, dtype=dtype, optimizer=None, fake=fake,
                        steady_state=False)
    return LimitRun(n, pred.after_forward["Total"], pred.peak, pred.saved_peak, pred.method,
                    pred.kept_after_forward)


#: the seed's CUDA initialisation for torch, MB (listed apart from its table: "about 280 MB")
SEED003_TORCH_INIT_MB = 280


def seed003_forward_table(ns=None):
    """The seed's torch "Forward" column against the course's forward increment at each N, like
    for like: both are what the forward pass adds on top of the network and the variables. The
    seed's is MB read off nvidia-smi (2017 PyTorch, cuDNN, the caching allocator's cache
    included); the course's is ``run_limit_test(n).forward_added`` (predicted for a CUDA GPU,
    tensors only). "excess" is the seed's minus the course's, in MB. A pandas DataFrame."""
    import pandas as pd

    rows = []
    for n in ns or [k for k, (f, _) in SEED003_TORCH.items() if f]:
        seed_fwd = SEED003_TORCH[n][0]
        inp = input_bytes(n) / 1e6
        ours = run_limit_test(n).forward_added / 1e6
        rows.append({"N": n, "input MB": round(inp, 2), "seed forward MB": seed_fwd,
                     "course forward added MB": round(ours, 1),
                     "excess MB": round(seed_fwd - ours, 1),
                     "excess / input": round((seed_fwd - ours) / inp, 1),
                     "method": "seed: nvidia-smi (2017); course: predicted for a CUDA GPU"})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The step on a real card: what the course's GPU runs measured (docs/gpu-runs/)
# --------------------------------------------------------------------------------------------
_LIMIT_KEYS = {"N", "measured peak MiB", "measured after forward MiB", "predicted peak MiB", "predicted after forward MiB"}


def recorded_backward_excess(folder=None):
    """Seed 003's step as the course's GPU runs measured it at N = 128, 256, 384: the H100 run's
    ``limit.json`` and the kit's ``examples/seed003`` task in each ``kit.json`` under
    ``docs/gpu-runs/`` (``folder``: its default is ``recorded.gpu_runs``'). Per run and N: what
    the backward pass adds on top of the forward (peak minus allocated after the forward),
    measured and predicted, and their difference in input volumes (4 N^3 bytes). A difference of
    two rises cancels what was allocated before the step (65 MiB on the H200 run). A pandas
    DataFrame, one row per run and N; empty without a recorded run."""
    import pandas as pd

    found = []
    for path in sorted(recorded.runs_folder(folder).glob("*/limit.json")):  # the first run's own file
        try:
            data, machine, _ = recorded.read_kit(path)
        except RecordError as err:
            skipped(err)
            continue
        found.append((machine, data.get("limit") or [], path))
    found += [(m, result.get("rows") or [], path) for m, result, path in recorded.kit_results("examples/seed003", folder)]
    rows = []
    for m, limit_rows, path in found:
        for r in recorded.checked_rows(limit_rows, _LIMIT_KEYS, path, "seed 003's limit rows"):
            measured = r["measured peak MiB"] - r["measured after forward MiB"]
            predicted = r["predicted peak MiB"] - r["predicted after forward MiB"]
            rows.append({"GPU run": recorded.run_label(m), "N": r["N"],
                         "backward adds, measured MiB": measured, "backward adds, predicted MiB": predicted,
                         "extra / input volume": (measured - predicted) * MiB / input_bytes(r["N"])})
    return pd.DataFrame(rows)


def recorded_diagnosis(folder=None):
    """Seed 003's step at N = 128 op by op, as the GPU kit's diagnosis recorded it
    (``*/details/diagnose-seed003.json`` under ``docs/gpu-runs/``; ``folder``: as
    ``recorded_backward_excess``'), the newest run: per setting (the prediction, cuDNN's default,
    ``cudnn.benchmark``, TF32 off, cuDNN off), how far the step's peak rose above its start and
    what the convolutions' backward allocated and freed inside themselves (their transients: a
    workspace). A pandas DataFrame, one row per setting, ``attrs["run"]`` naming the run; empty
    without a recording."""
    import pandas as pd

    found = recorded.diagnosis("seed003", folder)
    if found is None:
        return pd.DataFrame()
    settings, label, _ = found
    rows = {setting: {"peak above the step's start MiB": (max(o["peak"] for o in ops) - ops[0]["before"]) / MiB,
                      "convolution backward transients MiB": sum(o["transient"] for o in ops
                                                                  if "convolution_backward" in o["op"]) / MiB}
            for setting, ops in settings.items()}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.attrs["run"] = label
    return table


def recorded_largest_n(key: str = "03/largest_n") -> dict | None:
    """The largest N a GPU run measured under notebook 03's 8 GiB cap (``recorded.lookup(key)``):
    ``{"N", "context" (bytes the search subtracted from the cap, measured mid-notebook), "context
    at start" (MiB, what the same run measured when it began: ``recorded.gpu_runs``; None if not
    recorded), "gpu", "label"}``; None without a recording."""
    rec = recorded.lookup(key)
    if rec is None:
        return None
    row = rec.value.iloc[0]  # its cap reads "8 GiB - context <MiB> MiB"
    context_mib = float(row["cap"].split("context ")[1].split()[0])
    start = next((r.context_mib for r in recorded.gpu_runs()
                  if (r.meta["gpu"], r.meta["date"]) == (rec.meta["gpu"], rec.meta["date"])), None)
    return {"N": int(row["largest N, measured"]), "context": context_mib * MiB, "context at start": start,
            "gpu": rec.meta["gpu"], "label": rec.label}


def largest_n_on_a_card(budget_bytes: float, context_bytes: float, workspace_volumes: float,
                        reserved_ratio: float, start: int = 16):
    """Seed 003's largest N on a card of ``budget_bytes``, one correction at a time, each a
    search over ``run_limit_test``'s predicted peak (``largest_that_fits``): the budget as 8 GiB
    of tensors; minus ``context_bytes`` (what the GPU holds outside the allocator, which the GPU
    search subtracts from its cap); plus ``workspace_volumes`` input volumes at the peak (cuDNN's
    backward workspace, which the CPU prediction does not see); times ``reserved_ratio`` (the cap
    limits the allocator's reserved segments, not the tensors). A pandas Series, step -> N."""
    import pandas as pd

    cap = budget_bytes - context_bytes

    def largest(bound, volumes=0.0, ratio=1.0):
        return largest_that_fits(lambda k: ratio * (run_limit_test(k).peak + volumes * input_bytes(k)) <= bound,
                                 start=start, limit=4096)

    return pd.Series({"tensors alone fill the budget": largest(budget_bytes),
                      "minus the context": largest(cap),
                      f"plus cuDNN's workspace ({workspace_volumes:g} volumes)": largest(cap, workspace_volumes),
                      f"reserved = {reserved_ratio:.2f} x allocated": largest(cap, workspace_volumes, reserved_ratio)},
                     name="largest N [predicted, corrected]")


# --------------------------------------------------------------------------------------------
# The graph walk, drawn: which tensors of the forward pass autograd saved (notebook 03)
# --------------------------------------------------------------------------------------------
def forward_tensors(net: nn.Sequential, x: torch.Tensor, target: torch.Tensor):
    """Seed 003's forward and MSE loss run one module at a time, keeping every module's output:
    ``(loss, [(name, tensor), ...])`` in forward order -- the input, each output ("conv 1",
    "relu 1", ...) and the target. The graph is the one ``net(x)`` builds; holding each output
    keeps its storage distinct, so a walk's storage keys (``memory.saved_tensors``) name them."""
    named, counts, h = [("input", x)], {}, x
    for module in net:
        h = module(h)
        kind = {"Conv3d": "conv", "ReLU": "relu"}.get(type(module).__name__, type(module).__name__.lower())
        counts[kind] = counts.get(kind, 0) + 1
        named.append((f"{kind} {counts[kind]}", h))
    named.append(("target", target))
    return nn.functional.mse_loss(h, target), named


#: a backward node's short name in the drawing
_NODE = {"ConvolutionBackward0": "conv", "ReluBackward0": "relu", "MseLossBackward0": "MSE"}


def saved_by(named: list[tuple[str, torch.Tensor]], rows: list[SavedTensor]) -> dict[str, list[str]]:
    """For each tensor of ``forward_tensors``, the backward nodes of the walk ``rows`` that saved
    its storage, as "node: what" (e.g. ``["relu: result", "conv: input"]``); empty where none did
    (that tensor is freed once the next op has read it). Parameters are left out."""
    by_storage: dict[int, list[str]] = {}
    for r in rows:
        if not r.is_param:
            by_storage.setdefault(r.storage, []).append(
                f"{_NODE.get(r.node, r.node)}: {r.attr.removeprefix('_saved_')}")
    return {name: by_storage.get(storage_key(t), []) for name, t in named}


def draw_saved(named: list[tuple[str, torch.Tensor]], rows: list[SavedTensor], ax=None):
    """The graph walk drawn: one box per tensor of ``forward_tensors`` in forward order, labelled
    with its size in input-sizes (the box grows with it), shaded where the walk ``rows`` found its
    storage saved and labelled under it with the nodes that saved it; white where nothing saved it.
    Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.6))
    saved, unit = saved_by(named, rows), named[0][1].numel()
    x, kept, freed = 0.0, 0, 0
    for i, (name, t) in enumerate(named):
        size = t.numel() / unit
        gap, width = (1.2 if name == "target" else 0.45), 1.4 + size / 2  # legible at 1 x
        if i:
            ax.annotate("", (x + gap, 0.5), (x, 0.5), arrowprops=dict(arrowstyle="->", lw=0.8,
                        ls=":" if name == "target" else "-"))
            x += gap
        on = bool(saved[name])
        kept, freed = kept + size * on, freed + size * (not on)
        ax.add_patch(plt.Rectangle((x, 0), width, 1, facecolor="#8172b2" if on else "white", edgecolor="k",
                                   label=name, gid="saved" if on else "freed"))
        ax.text(x + width / 2, 0.5, f"{name}\n{size:g} x", ha="center", va="center", fontsize=8,
                color="white" if on else "k")
        ax.text(x + width / 2, -0.12, "\n".join(saved[name]) or "freed", ha="center", va="top", fontsize=7)
        x += width
    ax.set_xlim(-0.2, x + 0.2)
    ax.set_ylim(-0.65, 1.1)
    ax.axis("off")
    ax.set_title(f"the graph walk: shaded = storages autograd saved, {kept:g} x the input (under each: which "
                 f"backward saved it)\nwhite = freed once the next op has read it, {freed:g} x", fontsize=9)
    return ax


guard(globals(), TechniqueError)

"""How far a parallel result may be from the reference, and why: TF32's error on the demos'
net (``tf32_errors``, ``tf32_branches``), how close its forward pass comes to a ReLU's or a
max-pool's branch (``branch_margin``), the float64 reference and fp32's error against it
(``reference_grads``), and the fp32 reference in the ranks' own arithmetic
(``ranks_order_grads``: what a computation on a net whose branch margin is below 1 is compared
with).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn

from ..checks import ParallelError, guard
from ..tf32 import emulate_tf32, exact_fp32
from .data_parallel import accumulated_grads, build_net, global_batch, relative_error, single_process_grads
from .launcher import backend_for

# Branches: a ReLU's kink and a max-pool window's winner. Where a value sits within rounding of
# one, two computations that round differently take different branches, and the gradient of what
# the branch touches moves by a whole step, not by a rounding.
_BRANCHES = (nn.ReLU, nn.MaxPool3d)


def _branch_inputs(net: nn.Module, x: torch.Tensor, force: list | None = None) -> tuple[list, torch.Tensor]:
    """Run ``net(x)``; returns the input of every ReLU and MaxPool3d call (in call order, with
    the module's kind) and the output. With
    ``force`` (such a list from another run), each of those modules takes the other run's branch:
    ReLU keeps the values that were positive there, max-pool takes the winner it took there."""
    seen: list[tuple[str, torch.Tensor]] = []
    stash: dict[int, torch.Tensor] = {}

    def pre(module, inputs):
        kind = type(module).__name__
        seen.append((kind, inputs[0].detach().clone()))
        if force is not None:
            stash[id(module)] = inputs[0].clone()  # an in-place ReLU overwrites its input

    def post(module, inputs, output):  # noqa: ARG001 - nn.Module forward hook (module, args, output)
        if force is None:
            return None
        i = len(seen) - 1
        kind, ref = force[i]
        x = stash.pop(id(module))
        if kind == "ReLU":
            return x * (ref > 0).to(x.dtype)
        _, idx = nn.functional.max_pool3d(ref, module.kernel_size, module.stride, module.padding,
                                          module.dilation, module.ceil_mode, return_indices=True)
        return x.flatten(2).gather(2, idx.flatten(2)).view_as(output)

    handles = [h for m in net.modules() if isinstance(m, _BRANCHES)
               for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    try:
        out = net(x)
    finally:
        for h in handles:
            h.remove()
    return seen, out


def _decisions(kind: str, t: torch.Tensor) -> torch.Tensor:
    """A ReLU's branch per value; a max-pool's winner per window (the course's nets pool by 2)."""
    if kind == "ReLU":
        return t > 0
    return nn.functional.max_pool3d(t, 2, 2, return_indices=True)[1]


def tf32_branches(config: dict) -> dict:
    """How TF32 (emulated) changes the branches of ``build_net(config)``'s forward pass on its
    global batch, and what its gradient error is once they are held. ``decisions``: ReLU and
    max-pool decisions of one forward pass; ``changed``: how many TF32 takes differently from
    fp32; ``error``: TF32's gradient error (``relative_error`` vs fp32); ``error, branches
    held``: the same with every ReLU and max-pool taking fp32's branch."""
    x, y = global_batch(config)

    def step(force=None):
        net = build_net(config)
        seen, out = _branch_inputs(net, x, force)
        nn.functional.cross_entropy(out, y).backward()
        return seen, [p.grad.clone() for p in net.parameters()]

    ref_seen, ref = step()
    with emulate_tf32():
        seen, grads = step()
        _, held = step(ref_seen)
    changed = sum(int((_decisions(k, a) != _decisions(k, b)).sum()) for (k, a), (_, b) in zip(ref_seen, seen, strict=True))
    return {"decisions": sum(_decisions(k, a).numel() for k, a in ref_seen), "changed": changed,
            "error": relative_error(grads, ref), "error, branches held": relative_error(held, ref)}


def branch_margin(config: dict) -> float:
    """How far the forward pass of ``build_net(config)`` stays from changing a branch in another
    fp32 computation: the smallest distance of a ReLU input from the kink, or of a max-pool
    window's winner from its runner-up, in units of the largest amount fp32 moves that layer's
    values (fp32 against float64). Above 1, this CPU's fp32 takes float64's branches; a GPU's
    fp32, whose kernels round differently but by the same order, takes them too while the margin
    is several times 1. Ties among a ReLU's zeros are left out: no gradient goes through them."""
    x, _ = global_batch(config)
    with torch.no_grad():
        fp32, _ = _branch_inputs(build_net(config), x)
        exact, _ = _branch_inputs(build_net(config).double(), x.double())
    margin = math.inf
    for (kind, a), (_, b) in zip(fp32, exact, strict=True):
        moved = (a.double() - b).abs().max().item()
        if kind == "ReLU":
            gap = b.abs()
        else:
            top = b.unfold(2, 2, 2).unfold(3, 2, 2).unfold(4, 2, 2).flatten(-3).topk(2, -1).values
            gap = torch.where(top[..., 0] > 0, top[..., 0] - top[..., 1], math.inf)
        if moved > 0:
            margin = min(margin, gap.min().item() / moved)
    return margin


def reference_grads(config: dict) -> dict:
    """One process on the whole global batch in float64 (on the CPU): ``grads``; and what fp32
    itself is off by on this net, in this process's summation order (``single_process_grads``
    against them): ``fp32_error``.

    No tolerance follows from ``fp32_error``. Where a value lies within rounding of a ReLU's kink
    or of a tie in a max-pool window (a ``branch_margin`` below 1), fp32 and float64 take
    different branches, and the gradient of what that branch touches moves by a whole step, not
    by a rounding: notebook 09's net (seed 0) is off by 1e-4 in fp32 where another seed's is off
    by 1e-7. Which branches fp32 takes then depends on the summation order, which changes with
    the device, the number of threads and the micro-batch size, so one order's error does not
    bound another's. Notebook 09 once allowed max(1e-4, 4 x ``fp32_error``): on its net at the
    GPU size, its ranks (one CPU thread each) were off by 1.2e-4 where its own process, on all
    the machine's threads, was off by 2.5e-5, and the recorded H200 run failed (this 2-core CPU
    gives 1.2e-4 on one thread and 5.3e-5 on two). Compare such a computation with
    ``ranks_order_grads``: the same arithmetic, so the same branches (tests/test_tf32.py)."""
    net = build_net(config).double()
    x, y = global_batch(config)
    nn.functional.cross_entropy(net(x.double()), y).backward()
    grads = [p.grad.detach().clone() for p in net.parameters()]
    return {"grads": grads, "fp32_error": relative_error(single_process_grads(config), grads)}


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """``torch.set_num_threads(n)`` inside, the previous count restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def ranks_order_grads(config: dict, micro_batches: int, world_size: int = 2) -> list[torch.Tensor]:
    """The fp32 gradient of ``build_net(config)`` on its global batch in ``micro_batches``
    pieces (each loss divided by their number, as ``accumulated_grads``), computed in the same
    arithmetic as ``launch``'s ranks: on their kind of device (``backend_for(world_size)``: the
    first GPU when they run on GPUs, else the CPU with one thread, as each CPU rank has), under
    ``exact_fp32()``, with the same micro-batches. A pipeline of those ranks runs the same ops on
    the same values, so its forward pass takes the same branches and its gradient differs from
    this one only by the order in which backward adds up the pieces: a rounding, even on a net
    whose ``branch_margin`` is below 1 (where two fp32 computations in different orders can
    differ by 1e-4, ``reference_grads``). Returned on the CPU."""
    device = torch.device("cuda", 0) if backend_for(world_size)[1] == "cuda" else torch.device("cpu")
    with exact_fp32(), (_threads(1) if device.type == "cpu" else contextlib.nullcontext()):
        return accumulated_grads(config, micro_batches, device=device)


def tf32_errors(config: dict, device: torch.device | str = "cpu") -> list[dict]:
    """How far TF32 convolutions move the gradient of ``build_net(config)`` on its global batch,
    against the fp32 reference (``single_process_grads`` on the CPU), beside the difference a
    comparison should see (``exact_fp32``) and the one SGD lives with (another batch).

    On any machine: TF32 emulated on this CPU (``tf32.emulate_tf32``; operands rounded to
    nearest, and truncated), and the same under ``exact_fp32()``. On a CUDA ``device``, also
    measured there: PyTorch's default (TF32 convolutions on Ampere and newer GPUs) and under
    ``exact_fp32()``. Each row: ``key`` (tf32, tf32 truncated, exact, gpu default, gpu exact,
    another batch), ``computation``, ``error`` (``relative_error`` vs the reference), ``method``."""
    device = torch.device(device)
    ref = single_process_grads(config)
    rows = []

    def row(key: str, computation: str, grads: list[torch.Tensor], method: str) -> None:
        rows.append({"key": key, "computation": computation, "error": relative_error(grads, ref),
                     "method": method})

    for rounding in ("nearest", "truncate"):
        with emulate_tf32(rounding):
            grads = single_process_grads(config)
        row("tf32" if rounding == "nearest" else "tf32 truncated",
            f"TF32 convolutions, operands rounded ({rounding})", grads, "emulated on this CPU")
    with emulate_tf32(), exact_fp32():
        grads = single_process_grads(config)
    row("exact", "the same under exact_fp32()", grads, "emulated on this CPU")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32_hw = torch.cuda.get_device_capability(device) >= (8, 0)
        row("gpu default", f"PyTorch's default on {name}" + ("" if tf32_hw else " (no TF32 before compute capability 8.0)"),
            single_process_grads(config, device), f"measured on {device}")
        with exact_fp32():
            grads = single_process_grads(config, device)
        row("gpu exact", f"exact_fp32() on {name}", grads, f"measured on {device}")
    seed = config.get("data_seed", config.get("seed", 0))
    row("another batch", "fp32, another batch of the same size (SGD's noise)",
        single_process_grads(dict(config, data_seed=seed + 1)), "computed on this CPU")
    return rows


guard(globals(), ParallelError)

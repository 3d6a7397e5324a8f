"""Fully sharded data parallelism (FSDP2's ``fully_shard``): the units the demos shard
(``fsdp_units``), what a rank holds at rest and while a unit runs, computed (``fsdp_rank_memory``)
and measured with ``FSDPMemTracker`` (``fsdp_worker``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..checks import ParallelError, guard
from ..unet import UNet3D, named_blocks
from .data_parallel import build_net, global_batch, state_bytes
from .launcher import compared


def fsdp_units(net: UNet3D) -> list[nn.Module]:
    """The blocks the FSDP demos shard as units (each gathered while it runs): ``inc``, every
    ``Down`` and every ``Up``. What is left (``outc``) belongs to the root unit."""
    return [m for name, m in named_blocks(net) if name != "outc"]


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


#: FSDP2's default backward prefetch: while a unit runs its backward, the next unit to run
#: backward (the one before it in forward order) is already all-gathered. ``fully_shard``'s
#: ``set_modules_to_backward_prefetch`` (torch 2.13 docstring): "overrides the default backward
#: prefetching implementation that prefetches the next FSDP module based on the reverse
#: post-forward order. Passing a singleton list containing the previous FSDP module gives the
#: same all-gather overlap behavior as the default"; the code: ``FSDPParamGroup._backward_prefetch``.
BACKWARD_PREFETCH = 1


def fsdp_backward_moments(net: nn.Module, units: Sequence[nn.Module], world: int, bytes_per_value: int = 4,
                          backward_prefetch: int = BACKWARD_PREFETCH) -> list[dict[str, float]]:
    """Per unit (``units`` in forward order), the parameter and gradient bytes a rank holds at
    the end of that unit's backward, just before its reduce-scatter (computed, not measured):

    * ``sharded params``: the rank's 1/world shard of every parameter;
    * ``gathered params``: the unit's full parameters, and the root's (the root unit stays
      gathered through the step);
    * ``prefetched params``: the ``backward_prefetch`` units before it in forward order, already
      all-gathered for their own backward (FSDP2's default: one);
    * ``unsharded grads``: the unit's full gradient (and the root's, reduced at the end);
    * ``reduced grads``: the gradient shards of the units whose backward is done (those after it
      in forward order): the gradients were set to None at the start of the step
      (``zero_grad()``'s default), so the other shards do not exist yet;
    * ``reduce-scatter input``: the flat input of the previous unit's reduce-scatter (the unit
      after it in forward order: its full gradient), which FSDP2 still holds
      (``FSDPParamGroup.post_backward`` recycles it at the next reduce-scatter; measured on CPU).

    The first unit is the exception: it takes the model's input, which needs no gradient, so
    FSDP2 runs its post-backward in backward's final callback, after the root's; by then the
    root is resharded and reduced, and its reduce-scatter input is the one held.

    Optimizer state (resident between steps) is not included; ``fsdp_worker`` measures the same
    moment with ``FSDPMemTracker``."""
    sizes = [_n_params(u) for u in units]
    total = _n_params(net)
    root = total - sum(sizes)
    b = bytes_per_value
    rows = []
    for k, size in enumerate(sizes):
        # the first unit takes the model's input, which needs no gradient: FSDP2 has no hook to run
        # its post-backward, and runs it in backward's final callback, after the root's (measured)
        root_still = 0 if k == 0 else root
        row = {"sharded params": total * b / world, "gathered params": (size + root_still) * b,
               "prefetched params": sum(sizes[max(0, k - backward_prefetch):k]) * b,
               "unsharded grads": (size + root_still) * b,
               "reduced grads": (sum(sizes[k + 1:]) + root - root_still) * b / world,
               "reduce-scatter input": (sum(sizes[k + 1:k + 2]) if k else root) * b}
        rows.append({"unit": k, **row, "total": sum(row.values())})
    return rows


def fsdp_forward_moments(net: nn.Module, units: Sequence[nn.Module], bytes_per_value: int = 4) -> list[dict]:
    """Per unit, in forward order, the parameter bytes a rank holds besides its shards while the
    unit runs forward (computed from the units' sizes): the unit gathered with the root's
    parameters (those of no unit), and the flat all-gather output FSDP2 keeps until the next
    unit's all-gather (``FSDPParamGroup.wait_for_unshard``): the unit's own, or the previous
    unit's where that is larger."""
    sizes = [_n_params(u) for u in units]
    root = _n_params(net) - sum(sizes)
    return [{"gathered params": (s + root) * bytes_per_value,
             "all-gather buffer": max(s, sizes[k - 1] if k else 0) * bytes_per_value}
            for k, s in enumerate(sizes)]


def fsdp_rank_memory(net: nn.Module, units: Sequence[nn.Module], world: int,
                     bytes_per_value: int = 4, optimizer_states: int = 2,
                     backward_prefetch: int = BACKWARD_PREFETCH) -> dict[str, float]:
    """Bytes a rank holds under FSDP2 besides activations, computed from the model's units (not
    measured); ``units`` in forward order.

    At rest (between steps): a 1/world shard of the parameters, of the gradients and of the
    optimizer state (Adam: 2 values per parameter). ``working``: the largest moment of the
    steady-state step, the end of a unit's backward (``fsdp_backward_moments``): the optimizer
    state plus that moment's parameters and gradients, the unit gathered *and* the next one
    prefetched (FSDP2's default ``backward_prefetch=1``). ``working, shards kept``: the same with
    every gradient shard present (``zero_grad(set_to_none=False)``, or the first step's budget
    rule: resting + gathered + prefetched + unsharded gradient + the previous reduce-scatter's
    input). ``working, no prefetch``: without
    the prefetched unit (``backward_prefetch=0``). ``forward``: the largest moment of forward,
    where a unit's flat all-gather output lives until the next unit's all-gather (FSDP2's
    implicit forward prefetch, ``FSDPParamGroup.wait_for_unshard``): at most two units at once.
    ``working params``: the parameter tensors while the largest unit runs (its shard and the
    gathered unit; a prefetched unit is still an all-gather buffer, not parameters).
    Activations are not included."""
    total = _n_params(net)
    sizes = [_n_params(u) for u in units]
    root = total - sum(sizes)
    b = bytes_per_value
    rest = {"params": total * b / world, "grads": total * b / world,
            "optimizer": optimizer_states * total * b / world}
    moments = fsdp_backward_moments(net, units, world, b, backward_prefetch)
    top = max(moments, key=lambda m: m["total"])
    no_prefetch = max(m["total"] - m["prefetched params"] for m in moments)
    extra = top["gathered params"] + top["prefetched params"] + top["unsharded grads"] + top["reduce-scatter input"]
    forward = rest["params"] + rest["optimizer"] + max(
        m["gathered params"] + m["all-gather buffer"] for m in fsdp_forward_moments(net, units, b))
    return {**{f"rest {k}": v for k, v in rest.items()},
            "resting": sum(rest.values()),
            "working unit": top["unit"],
            "gathered params": top["gathered params"], "prefetched params": top["prefetched params"],
            "unsharded grads": top["unsharded grads"], "reduced grads": top["reduced grads"],
            "reduce-scatter input": top["reduce-scatter input"],
            "working": rest["optimizer"] + top["total"],
            "working, shards kept": sum(rest.values()) + extra,
            "working, no prefetch": rest["optimizer"] + no_prefetch,
            "working params": rest["params"] + (max(sizes) + root) * b,
            "forward": forward}


def fsdp_unit_names(net: UNet3D) -> list[str]:
    """The names of ``fsdp_units(net)``, in forward order: ``inc``, ``downs.0`` ..., ``ups.0`` ..."""
    return [name for name, _ in named_blocks(net) if name != "outc"]


def moments_table(net: UNet3D, measured: Sequence[dict], world: int):
    """Per unit, in forward order: what a rank holds at the end of the unit's backward (KiB),
    computed (``fsdp_backward_moments``: the unit's parameters and gradient, the prefetched
    unit, the previous reduce-scatter's input, their total) beside ``measured``, the
    ``backward_moments`` ``fsdp_worker`` returned (``FSDPMemTracker``'s categories, summed). A
    pandas DataFrame."""
    import pandas as pd

    names = fsdp_unit_names(net)
    return pd.DataFrame([{"unit": names[c["unit"]], "its params + grads KiB": (c["gathered params"] + c["unsharded grads"]) / 1024,
                          "prefetched KiB": c["prefetched params"] / 1024,
                          "previous reduce-scatter KiB": c["reduce-scatter input"] / 1024,
                          "computed KiB": c["total"] / 1024, "measured KiB": sum(m[k] for k in m if k != "unit") / 1024}
                         for c, m in zip(fsdp_backward_moments(net, fsdp_units(net), world), measured, strict=True)])


def fsdp_timeline(net: UNet3D, world: int) -> list[tuple[str, dict[str, float]]]:
    """One rank's bytes besides activations through a steady-state FSDP2 step with Adam, fp32,
    computed from the units' sizes (not measured): ``("at rest", parts)``, then one moment per
    unit while it runs forward (``"F <unit>"``: its gathered parameters and the root's, beside
    the flat all-gather buffer FSDP2 keeps until the next unit's all-gather), then one per unit at
    the end of its backward, in backward order (``"B <unit>"``: ``fsdp_backward_moments``).
    ``parts`` maps a kind of tensor to bytes; the moments' totals are ``fsdp_rank_memory``'s
    figures (its ``forward`` and ``working``). For ``parallel_plots.plot_memory_timeline``."""
    units, names = fsdp_units(net), fsdp_unit_names(net)
    rank = fsdp_rank_memory(net, units, world)
    shards = {"params": rank["rest params"], "optimizer": rank["rest optimizer"]}
    forward = [(f"F {name}", {**shards, **m}) for name, m in zip(names, fsdp_forward_moments(net, units), strict=True)]
    backward = [(f"B {names[m['unit']]}", {**shards, "params": m["sharded params"], "grads": m["reduced grads"],
                 "gathered params": m["gathered params"], "prefetched params": m["prefetched params"],
                 "unsharded grads": m["unsharded grads"] + m["reduce-scatter input"]})
                for m in reversed(fsdp_backward_moments(net, units, world))]
    return [("at rest", {**shards, "grads": rank["rest grads"]}), *forward, *backward]


#: FSDPMemTracker's categories of parameter and gradient bytes (``_FSDPRefType`` values); the
#: prefetched unit is in "All Gather" (its flat all-gather output, copied out when its own
#: backward starts)
_PARAM_GRAD_KINDS = ("Sharded Param", "Unsharded Param", "All Gather", "Sharded Grad", "Unsharded Grad",
                     "Reduce Scatter")


def _kinds(snap: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_kind in snap.values():
        for k, v in per_kind.items():
            key = str(getattr(k, "value", k))
            out[key] = out.get(key, 0) + v
    return out


def _fsdp_peaks(tracker, units: Sequence[nn.Module]) -> dict:
    """From ``FSDPMemTracker``'s snapshots: the largest parameter bytes (sharded + unsharded
    parameters) over the step, the largest all-gather buffer, and per unit the parameter
    and gradient bytes at the end of its backward (snapshot ``BEF_POST_BW``: before its
    reduce-scatter), by category."""
    peaks = {"working_param_bytes": 0, "all_gather_bytes": 0}
    for stats in tracker.memory_tracking.values():
        for snaps in getattr(stats, "snapshots", {}).values():
            for snap in snaps:
                kinds = _kinds(snap)
                params = kinds.get("Sharded Param", 0) + kinds.get("Unsharded Param", 0)
                peaks["working_param_bytes"] = max(peaks["working_param_bytes"], params)
                peaks["all_gather_bytes"] = max(peaks["all_gather_bytes"], kinds.get("All Gather", 0))
    moments = []
    for k, unit in enumerate(units):
        snaps = tracker.memory_tracking[unit].snapshots
        phase = next(p for p in snaps if str(getattr(p, "value", p)) == "Before Post-Backward")
        kinds = _kinds(snaps[phase][-1])
        moments.append({"unit": k, **{c: kinds.get(c, 0) for c in _PARAM_GRAD_KINDS}})
    peaks["backward_moments"] = moments
    return peaks


@compared
def fsdp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One step with FSDP2: every parameter, its gradient and Adam's state sharded over ranks.
    ``FSDPMemTracker`` (torch's FSDP-aware MemTracker) records, unit by unit, what the rank
    holds: the resting shard and the parameters gathered while a unit runs.

    The ranks' mesh is built on the rank's own device: without one, ``fully_shard`` builds its
    default on ``torch._C._get_accelerator()`` (torch 2.13's ``_init_default_mesh``), CUDA
    whenever a GPU is visible, and on a one-GPU machine, whose ranks run gloo on the CPU, it moved
    the parameters to ``cuda:0`` beside a CPU batch (the H200 run of 2026-11-27)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = build_net(config).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for unit in fsdp_units(net):
        fully_shard(unit, mesh=mesh)
    fully_shard(net, mesh=mesh)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(net.parameters())
    tracker = FSDPMemTracker(net, opt)
    with tracker:
        loss = nn.functional.cross_entropy(net(xs), ys)
        loss.backward()
        opt.step()
    full = [p.grad.full_tensor().detach().cpu() for p in net.parameters()]
    return {"rank": rank, "loss": loss.item(), "grads": full, "mesh_device": mesh.device_type,
            "param_devices": sorted({p.device.type for p in net.parameters()}), **_fsdp_peaks(tracker, fsdp_units(net)),
            **state_bytes(list(net.parameters()), opt)}


guard(globals(), ParallelError)

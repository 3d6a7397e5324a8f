"""Fully sharded data parallelism (FSDP2's ``fully_shard``): the units the demos shard
(``fsdp_units``), what a rank holds at rest and while a unit runs, computed (``fsdp_rank_memory``)
and measured with ``FSDPMemTracker`` (``fsdp_worker``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..unet import UNet3D
from .data_parallel import _state_bytes, build_net, global_batch
from .launcher import compared


def fsdp_units(net: UNet3D) -> list[nn.Module]:
    """The blocks the FSDP demos shard as units (each gathered while it runs): ``inc``, every
    ``Down`` and every ``Up``. What is left (``outc``) belongs to the root unit."""
    return [net.inc, *net.downs, *net.ups]


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def fsdp_rank_memory(net: nn.Module, units: Sequence[nn.Module], world: int,
                     bytes_per_value: int = 4, optimizer_states: int = 2) -> dict[str, float]:
    """Bytes a rank holds under FSDP2, computed from the model's units (not measured).

    At rest (between steps): a 1/world shard of the parameters, of the gradients and of the
    optimizer state (Adam: 2 values per parameter). While a unit runs, it is gathered: the rank
    holds the whole unit's parameters (and, in its backward, its whole gradient until the
    reduce-scatter) on top of its shards; the root unit's parameters stay gathered through the
    step. The largest unit sets the working peak. Activations and communication buffers are not
    included."""
    total, largest = _n_params(net), max(_n_params(u) for u in units)
    root = total - sum(_n_params(u) for u in units)
    b = bytes_per_value
    rest = {"params": total * b / world, "grads": total * b / world,
            "optimizer": optimizer_states * total * b / world}
    return {**{f"rest {k}": v for k, v in rest.items()},
            "resting": sum(rest.values()),
            "gathered params": (largest + root) * b, "unsharded grads": largest * b,
            "working": sum(rest.values()) + (2 * largest + root) * b,
            "working params": total * b / world + (largest + root) * b}


def _fsdp_peaks(tracker) -> dict[str, int]:
    """Largest bytes per FSDP category over every snapshot ``FSDPMemTracker`` took."""
    peaks = {"working_param_bytes": 0, "all_gather_bytes": 0}
    for stats in tracker.memory_tracking.values():
        for snaps in getattr(stats, "snapshots", {}).values():
            for snap in snaps:
                for per_kind in snap.values():
                    kinds = {str(getattr(k, "value", k)): v for k, v in per_kind.items()}
                    params = kinds.get("Sharded Param", 0) + kinds.get("Unsharded Param", 0)
                    peaks["working_param_bytes"] = max(peaks["working_param_bytes"], params)
                    peaks["all_gather_bytes"] = max(peaks["all_gather_bytes"], kinds.get("All Gather", 0))
    return peaks


@compared
def fsdp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One step with FSDP2: every parameter, its gradient and Adam's state sharded over ranks.
    ``FSDPMemTracker`` (torch's FSDP-aware MemTracker) records, unit by unit, what the rank
    holds: the resting shard and the parameters gathered while a unit runs."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard

    net = build_net(config).to(device)
    for unit in fsdp_units(net):
        fully_shard(unit)
    fully_shard(net)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(net.parameters())
    tracker = FSDPMemTracker(net, opt)
    with tracker:
        loss = nn.functional.cross_entropy(net(xs), ys)
        loss.backward()
        opt.step()
    full = [p.grad.full_tensor().detach().cpu() for p in net.parameters()]
    return {"rank": rank, "loss": loss.item(), "grads": full, **_fsdp_peaks(tracker),
            **_state_bytes(list(net.parameters()), opt)}

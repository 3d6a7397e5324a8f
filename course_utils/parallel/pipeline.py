"""Model and pipeline parallelism: the U-Net in two stages (``EncoderStage``,
``DecoderStage``, ``TwoStageUNet``, ``split_and_reference``), the schedules (``schedule_order``:
GPipe, 1F1B; ``replay_schedule``, ``bubble_fraction``), the workers that run them on two ranks
(``pipeline_worker``: hand-written sends, timed by ``OpTimer``; ``pipelining_worker``:
``torch.distributed.pipelining``), and memory per GPU of data x pipeline layouts
(``pipeline_layouts``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..budget import ddp_bucket_bytes
from ..checks import ParallelError, guard
from ..memory import SavedTensorMeter, predict_step
from ..tf32 import exact_fp32
from ..unet import UNet3D
from .data_parallel import build_net, global_batch
from .launcher import compared


class EncoderStage(nn.Module):
    """Stage 1 of a split U-Net: ``inc`` and every ``Down``; returns all skip tensors."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.inc, self.downs = net.inc, net.downs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        skips = [self.inc(x)]
        for d in self.downs:
            skips.append(d(skips[-1]))
        return skips


class DecoderStage(nn.Module):
    """Stage 2: every ``Up`` and ``outc``; takes the skip tensors (deepest last)."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.ups, self.outc = net.ups, net.outc

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        skips = list(skips)
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


class TwoStageUNet(nn.Module):
    """The U-Net split across two devices. Every skip connection crosses the boundary: the
    encoder's outputs are moved to the second device, the gradients come back in backward."""

    def __init__(self, net: UNet3D, devices=("cpu", "cpu")):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]
        self.encoder = EncoderStage(net).to(self.devices[0])
        self.decoder = DecoderStage(net).to(self.devices[1])
        self.boundary_bytes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = self.encoder(x.to(self.devices[0]))
        self.boundary_bytes = sum(s.numel() * s.element_size() for s in skips)
        return self.decoder([s.to(self.devices[1]) for s in skips])


def stage_of(name: str) -> int:
    """0 for the encoder's modules (``inc``, ``downs``), 1 for the decoder's (``ups``, ``outc``)."""
    return 0 if name.split(".")[0] in ("inc", "downs") else 1


def split_and_reference(net: UNet3D, x: torch.Tensor, devices=("cpu", "cpu")) -> dict:
    """Runs ``net`` whole on ``devices[0]`` (the reference: same device, same precision), then
    split in two stages on ``devices``; returns both outputs and both gradient lists, and the
    bytes that crossed the boundary. Done under ``exact_fp32``."""
    devices = [torch.device(d) for d in devices]
    with exact_fp32():
        net.to(devices[0]).zero_grad(set_to_none=True)
        ref = net(x.to(devices[0]))
        ref.sum().backward()
        ref_grads = [p.grad.detach().clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)
        staged = TwoStageUNet(net, devices)
        out = staged(x)
        out.sum().backward()
    return {"out": out.detach(), "ref": ref.detach(), "grads": [p.grad for p in net.parameters()],
            "ref_grads": ref_grads, "boundary_bytes": staged.boundary_bytes}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of each device for S balanced stages and M micro-batches,
    (S - 1) / (M + S - 1): the same for GPipe and 1F1B (1F1B saves memory, not time)."""
    return (stages - 1) / (micro_batches + stages - 1)


def gpipe_idle(forward: Sequence[float], backward: Sequence[float], micro_batches: int) -> list[float]:
    """Each stage's idle share under GPipe when the stages are *not* equal: ``forward[s]`` and
    ``backward[s]`` are stage s's durations for one micro-batch (the same for every micro-batch),
    communication is free.

    Derivation: the forwards are a flow shop of M identical jobs through the S stages in order,
    so the last stage finishes its last forward at sum(forward) + (M - 1) max(forward); the
    backwards then flow back the same way, sum(backward) + (M - 1) max(backward) more. Stage s
    is busy M (forward[s] + backward[s]) of that step. With equal stages, forward f and
    backward b, the step is (M + S - 1)(f + b) and every stage's idle share is
    ``bubble_fraction(S, M)`` = (S - 1) / (M + S - 1). With unequal stages, as M grows stage s's
    idle share falls towards 1 - (forward[s] + backward[s]) / (max(forward) + max(backward)),
    never below it: 0 only for a stage that is the slowest in both directions. The others wait
    more than with equal stages."""
    m = micro_batches
    step = sum(forward) + (m - 1) * max(forward) + sum(backward) + (m - 1) * max(backward)
    return [1 - m * (f + b) / step for f, b in zip(forward, backward, strict=True)]


def bubble_table(runs: dict[tuple[str, int], tuple[dict, dict]]) -> dict:
    """Notebook 09's bubble, from ``pipeline_worker``'s runs as ``{(schedule, M): (rank 0's run,
    rank 1's run)}`` (GPipe for M = 1, 4 and 8 at least). Idle share = 1 - busy / step, busy =
    the time inside the stage's forwards and backwards. Returns:

    * ``measured``: per run, the step and each stage's idle share as the ranks measured them, and
      as *replayed*: the schedule run again on paper with the same op durations and free
      communication (``replay_timelines``);
    * ``formula``: per GPipe run, ``gpipe_idle`` with each stage's mean durations beside the
      equal-stage ``bubble_fraction``, and the step of 1F1B over GPipe's, both replayed with
      those constant durations;
    * ``formula_gap``: the largest difference between ``gpipe_idle`` and the replay of the same
      constant durations (the derivation checked: 0 up to rounding);
    * ``steps``: M -> (GPipe's, 1F1B's step) replayed with GPipe M's constant mean durations;
    * ``waits``: M -> each stage's replayed idle share under GPipe; ``heavier``: the stage (0 or
      1) busier at GPipe, M = 4; ``light_share``: the lighter stage's share of the work (M = 1);
      ``limit``: the idle share the heavier stage tends to as M grows (``gpipe_idle``'s
      docstring), with the largest M's durations; ``slower``: which stage is slower in the
      forward and in the backward direction (largest M)."""
    import pandas as pd

    def timelines(key):
        return [runs[key][0]["timeline"], runs[key][1]["timeline"]]

    measured, formula, steps, gap = [], [], {}, 0.0
    for (kind, m), (r0, r1) in runs.items():
        sim = replay_timelines(timelines((kind, m)), kind)
        measured.append({"schedule": kind, "M": m, "step s (measured)": round(max(r0["step_s"], r1["step_s"]), 3),
                         "idle 1 / 2 (measured)": f"{1 - r0['busy_s'] / r0['step_s']:.2f} / {1 - r1['busy_s'] / r1['step_s']:.2f}",
                         "idle 1 / 2 (replayed)": f"{sim['idle'][0]:.2f} / {sim['idle'][1]:.2f}"})
        if kind != "gpipe":
            continue
        fs, bs = stage_durations(timelines((kind, m)))
        const = [{**{("F", i): fs[s] for i in range(m)}, **{("B", i): bs[s] for i in range(m)}} for s in range(2)]
        idle = gpipe_idle(fs, bs, m)
        gpipe, ofob = replay_schedule(const, "gpipe"), replay_schedule(const, "1f1b")
        gap = max(gap, *(abs(a - b) for a, b in zip(idle, gpipe["idle"], strict=True)))
        steps[m] = (gpipe["step_s"], ofob["step_s"])
        formula.append({"M": m, "idle 1 / 2, gpipe_idle (these stages)": f"{idle[0]:.2f} / {idle[1]:.2f}",
                        "(S-1)/(M+S-1) (equal stages)": round(bubble_fraction(2, m), 2),
                        "1F1B step / GPipe step (same durations)": round(ofob["step_s"] / gpipe["step_s"], 3)})
    gpipe_ms = sorted(m for kind, m in runs if kind == "gpipe")
    waits = {m: replay_timelines(timelines(("gpipe", m)))["idle"] for m in gpipe_ms}
    heavier = 0 if runs["gpipe", 4][0]["busy_s"] > runs["gpipe", 4][1]["busy_s"] else 1
    f1, b1 = stage_durations(timelines(("gpipe", 1)))
    fm, bm = stage_durations(timelines(("gpipe", gpipe_ms[-1])))
    return {"measured": pd.DataFrame(measured), "formula": pd.DataFrame(formula), "formula_gap": gap,
            "steps": steps, "waits": waits, "heavier": heavier,
            "light_share": (f1[1 - heavier] + b1[1 - heavier]) / (sum(f1) + sum(b1)),
            "limit": 1 - (fm[heavier] + bm[heavier]) / (max(fm) + max(bm)),
            "slower": {"forward": max((0, 1), key=lambda s: fm[s]), "backward": max((0, 1), key=lambda s: bm[s])}}


def stage_durations(timelines: Sequence[list[tuple[str, int, float, float]]]) -> tuple[list[float], list[float]]:
    """Each stage's mean forward and mean backward duration of one micro-batch, from the ranks'
    measured ``timeline``s: the inputs of ``gpipe_idle``."""
    def mean(tl, kind):
        d = [e - s for k, _, s, e in tl if k == kind]
        return sum(d) / len(d)

    return [mean(tl, "F") for tl in timelines], [mean(tl, "B") for tl in timelines]


SCHEDULES = ("gpipe", "1f1b")


def schedule_order(kind: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The ops one stage runs, in order: ("F", i) forward of micro-batch i, ("B", i) backward.

    * ``gpipe`` (``torch.distributed.pipelining.ScheduleGPipe``): every forward, then every
      backward; a stage holds the activations of all M micro-batches.
    * ``1f1b`` (``torch.distributed.pipelining.Schedule1F1B``): S - 1 - stage forwards to fill
      the pipe, then one forward / one backward alternately; a stage holds at most S - stage.
    """
    m = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind != "1f1b":
        raise ValueError(f"schedule {kind!r}: choose one of {SCHEDULES}")
    warm = min(stages - 1 - stage, m)
    order = [("F", i) for i in range(warm)]
    for i in range(warm, m):
        order += [("F", i), ("B", i - warm)]
    return order + [("B", i) for i in range(m - warm, m)]


def in_flight(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose activations a stage holds at once (forwarded, not yet
    backwarded) in this order of ops."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def replay_schedule(durations: Sequence[dict[tuple[str, int], float]], kind: str = "gpipe") -> dict:
    """Replay a pipeline schedule with given op durations and free communication: when each op
    would start and end, the step time, each stage's idle share (the bubble) and the most
    micro-batches in flight per stage. ``durations[s][("F", i)]``: stage s's forward of
    micro-batch i. Dependencies: F(s, i) after F(s-1, i); B(s, i) after B(s+1, i); each stage
    runs its ops one at a time in ``schedule_order``."""
    stages = len(durations)
    m = 1 + max(i for k, i in durations[0] if k == "F")
    orders = [schedule_order(kind, s, stages, m) for s in range(stages)]
    end: dict[tuple[int, str, int], float] = {}
    free, pos = [0.0] * stages, [0] * stages
    ops: list[list[tuple[str, int, float, float]]] = [[] for _ in range(stages)]
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while pos[s] < len(orders[s]):
                k, i = orders[s][pos[s]]
                dep = (s - 1, "F", i) if k == "F" and s > 0 else \
                      (s + 1, "B", i) if k == "B" and s < stages - 1 else None
                if dep is not None and dep not in end:
                    break
                start = max(free[s], end.get(dep, 0.0))
                free[s] = end[s, k, i] = start + durations[s][k, i]
                ops[s].append((k, i, start, free[s]))
                pos[s] += 1
                progress = True
    if any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        raise RuntimeError(f"the {kind} schedule deadlocks with these durations")  # cannot happen
    step = max(free)
    return {"ops": ops, "step_s": step,
            "idle": [1 - sum(e - b for _, _, b, e in o) / step for o in ops],
            "in_flight": [in_flight(o) for o in orders]}


def unit_durations(stages: int, micro_batches: int, forward: float = 1.0,
                   backward: float = 2.0) -> list[dict[tuple[str, int], float]]:
    """Equal stages, every forward ``forward`` and every backward ``backward`` long (a backward
    costs about two forwards): the durations of the textbook schedules."""
    one = {**{("F", i): forward for i in range(micro_batches)}, **{("B", i): backward for i in range(micro_batches)}}
    return [dict(one) for _ in range(stages)]


def replay_timelines(timelines: Sequence[list[tuple[str, int, float, float]]], kind: str = "gpipe") -> dict:
    """``replay_schedule`` with the op durations the ranks measured (their ``timeline``s)."""
    return replay_schedule([{(k, i): e - s for k, i, s, e in tl} for tl in timelines], kind)


class OpTimer:
    """Start and end of each op of one stage, in seconds since ``reset``. CUDA runs kernels
    asynchronously: on a GPU the clock is read after ``torch.cuda.synchronize(device)``, so an
    op's duration covers its kernels, not only their launch."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.reset()

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def reset(self) -> None:
        self.ops: list[tuple[str, int, float, float]] = []
        self.t0 = self.now()

    def run(self, kind: str, i: int, fn: Callable[[], Any]) -> Any:
        start = self.now() - self.t0
        out = fn()
        self.ops.append((kind, i, start, self.now() - self.t0))
        return out


def _pipeline_step(rank: int, stage: nn.Module, order, xs, ys, shapes, device, timer: OpTimer) -> None:
    """One pipelined step of a 2-stage U-Net: rank 0 runs the encoder and sends the skip
    tensors; rank 1 runs the decoder and the loss and sends their gradients back. Sends are
    asynchronous (isend), so neither schedule can deadlock on them."""
    m = len(xs)
    held: dict[int, Any] = {}
    sends: list[tuple[Any, torch.Tensor]] = []
    for kind, i in order:
        if rank == 0 and kind == "F":
            skips = timer.run("F", i, lambda i=i: stage(xs[i].to(device)))
            for s in skips:
                s_out = s.detach().contiguous()
                sends.append((dist.isend(s_out, dst=1), s_out))
            held[i] = skips
        elif rank == 0:
            grads = [torch.empty_like(s) for s in held[i]]
            for g in grads:
                dist.recv(g, src=1)
            timer.run("B", i, lambda i=i, grads=grads: torch.autograd.backward(held[i], grads))
            del held[i]
        elif kind == "F":
            skips = [torch.empty(sh, device=device) for sh in shapes]
            for s in skips:
                dist.recv(s, src=0)
                s.requires_grad_()
            loss = timer.run("F", i, lambda i=i, skips=skips:
                             nn.functional.cross_entropy(stage(skips), ys[i].to(device)) / m)
            held[i] = (skips, loss)
        else:
            skips, loss = held.pop(i)
            timer.run("B", i, loss.backward)
            for s in skips:
                g = s.grad.contiguous()
                sends.append((dist.isend(g, dst=0), g))
    for work, _ in sends:
        work.wait()


@compared
def pipeline_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """The U-Net in 2 stages, one per rank: rank 0 the encoder, rank 1 the decoder and the loss.
    ``config["runs"]``: a list of ``{"micro_batches": M, "schedule": "gpipe" | "1f1b"}`` (default:
    one run from ``config``'s own keys). Each run: one warm-up step (first calls set up kernels)
    under a ``SavedTensorMeter`` (the peak bytes this stage holds for backward: its micro-batches
    in flight), then a timed step recording (kind, micro-batch, start, end) per op."""
    if world != 2:
        raise ValueError(f"pipeline_worker splits the U-Net in 2 stages: run it with 2 ranks, not {world}")
    runs = config.get("runs") or [{"micro_batches": config.get("micro_batches", 4),
                                  "schedule": config.get("schedule", "gpipe")}]
    net = build_net(config)
    x, y = global_batch(config)
    stage = (EncoderStage(net) if rank == 0 else DecoderStage(net)).to(device)
    params = list(stage.parameters())
    timer = OpTimer(device)
    results = []
    enc = EncoderStage(build_net(config)).to("meta")  # the boundary's shapes, per micro-batch size
    for run in runs:
        m, kind = run["micro_batches"], run.get("schedule", "gpipe")
        if x.shape[0] % m:
            raise ValueError(f"global batch {x.shape[0]} does not split into {m} equal micro-batches")
        xs, ys = x.chunk(m), y.chunk(m)
        shapes = [s.shape for s in enc(torch.empty(xs[0].shape, device="meta"))]
        order = schedule_order(kind, rank, 2, m)
        with SavedTensorMeter(params) as meter:  # warm-up step
            _pipeline_step(rank, stage, order, xs, ys, shapes, device, timer)
        stage.zero_grad(set_to_none=True)
        dist.barrier()
        timer.reset()
        _pipeline_step(rank, stage, order, xs, ys, shapes, device, timer)
        step_s = timer.now() - timer.t0
        dist.barrier()
        if rank == 0:  # one line per run: progress, in the notebook
            print(f"{kind} M={m} done (step {step_s:.2f} s)", flush=True)
        results.append({"micro_batches": m, "schedule": kind, "timeline": list(timer.ops),
                        "step_s": step_s, "busy_s": sum(e - s for _, _, s, e in timer.ops),
                        "saved_peak": meter.peak,
                        "grads": [p.grad.detach().cpu().clone() for p in params]})
        stage.zero_grad(set_to_none=True)
    return {"rank": rank, "runs": results, "param_bytes": sum(p.numel() * p.element_size() for p in params)}


class _TupleEncoder(nn.Module):
    """EncoderStage returning a tuple (``torch.distributed.pipelining`` sends tuples of tensors)."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.stage = EncoderStage(net)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.stage(x))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: the gradient of a concatenated skip tensor is
    a strided slice, and gloo sends and receives only contiguous tensors."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:  # noqa: ARG004 - torch.autograd.Function
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004 - torch.autograd.Function
        return grad.contiguous()


class _ArgsDecoder(nn.Module):
    """DecoderStage taking the skip tensors as separate arguments."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.stage = DecoderStage(net)

    def forward(self, *skips: torch.Tensor) -> torch.Tensor:
        return self.stage([_ContiguousGrad.apply(s) for s in skips])


@compared
def pipelining_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """The 2-stage U-Net run by ``torch.distributed.pipelining`` itself: a ``PipelineStage`` per
    rank and ``ScheduleGPipe`` or ``Schedule1F1B`` (``config["schedules"]``) over
    ``config["micro_batches"]``. For each schedule: the peak saved-for-backward bytes of this
    stage over one step (``SavedTensorMeter``) and the stage's gradients."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if world != 2:
        raise ValueError(f"pipelining_worker splits the U-Net in 2 stages: run it with 2 ranks, not {world}")
    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    m = config.get("micro_batches", 4)
    x, y = global_batch(config)
    results = {}
    for kind in config.get("schedules", ("gpipe", "1f1b")):
        net = build_net(config)
        module = (_TupleEncoder(net) if rank == 0 else _ArgsDecoder(net)).to(device)
        stage = PipelineStage(module, rank, 2, device)
        schedule = classes[kind](stage, n_microbatches=m, loss_fn=nn.functional.cross_entropy)
        with SavedTensorMeter(module.parameters()) as meter:
            if rank == 0:
                schedule.step(x.to(device))
            else:
                schedule.step(target=y.to(device))
        if rank == 0:
            print(f"torch.distributed.pipelining {kind} M={m} done", flush=True)
        results[kind] = {"saved_peak": meter.peak,
                         "grads": [p.grad.detach().cpu().clone() for p in module.parameters()]}
    return {"rank": rank, "micro_batches": m, "schedules": results}


def stage_parameters(model: UNet3D) -> dict[int, int]:
    """Number of parameters of each stage (0: encoder, 1: decoder) of a split U-Net."""
    params = {0: 0, 1: 0}
    for name, p in model.named_parameters():
        params[stage_of(name)] += p.numel()
    return params


def stage_saved_bytes(prediction) -> dict[int, int]:
    """Saved-for-backward bytes of each stage of a split U-Net, from a ``predict_step`` result:
    its modules' share (``per_module_saved``); what no module saved (the loss) goes to the last
    stage, which computes the loss."""
    saved = {0: 0, 1: 0}
    for name, nbytes in prediction.log.per_module_saved().items():
        saved[stage_of(name)] += nbytes
    saved[1] += max(0, prediction.saved_peak - saved[0] - saved[1])
    return saved


def pipeline_layouts(build: Callable[[], UNet3D], volume: Sequence[int], global_batch: int,
                     layouts: Sequence[tuple[int, int]], dtype: torch.dtype = torch.float16,
                     n_classes: int = 5) -> list[dict]:
    """Per-GPU memory of data-parallel x pipeline-parallel layouts ``(dp, pp)``, pp in (1, 2):
    an ESTIMATE from the predictor's parts, each counted once.

    A GPU holds (a) the parameters, gradients and Adam's two moments of the modules it runs:
    4 values per parameter in ``dtype``, from the parameter counts; (b) the saved-for-backward
    bytes of those modules for the batch it sees (``predict_step``'s per-module log, batch =
    global_batch / dp). With GPipe a stage keeps every micro-batch of its pipeline's batch; with
    1F1B and micro-batches of one sample, stage s keeps at most S - s of them. (c) With dp > 1,
    DDP's gradient buckets over the modules it runs (``ddp_bucket_bytes``: one more copy of their
    gradients, DDP's default). ``... (micro-batches of 1)``: every layout run in micro-batches of
    one sample, to compare like with like: a data-parallel replica accumulating gradients over its
    batch keeps one sample's activations (predicted at batch 1); a pipeline stage runs 1F1B (the
    1F1B column). Not counted: temporaries of backward, the CUDA context, the allocator's slack,
    NCCL's buffers."""
    with torch.device("meta"):
        params = stage_parameters(build())
    value_bytes = torch.empty((), dtype=dtype).element_size()
    static = {s: 4 * n * value_bytes for s, n in params.items()}
    saved_by_batch: dict[int, dict[int, int]] = {}
    rows = []
    for dp, pp in layouts:
        if pp not in (1, 2) or global_batch % dp:
            raise ValueError(f"layout ({dp}, {pp}): pp must be 1 or 2 and dp must divide {global_batch}")
        b = global_batch // dp
        if b not in saved_by_batch:
            pred = predict_step(build, (b, 1, *volume), n_classes=n_classes, dtype=dtype)
            saved_by_batch[b] = stage_saved_bytes(pred)
        saved = saved_by_batch[b]
        if pp == 1:
            if 1 not in saved_by_batch:
                saved_by_batch[1] = stage_saved_bytes(predict_step(build, (1, 1, *volume), n_classes=n_classes,
                                                                   dtype=dtype))
            one = saved_by_batch[1][0] + saved_by_batch[1][1]
            gpus = {"whole net": (static[0] + static[1], saved[0] + saved[1], saved[0] + saved[1], one)}
        else:
            gpus = {f"stage {s + 1}": (static[s], saved[s], saved[s] * min(2 - s, b) / b,
                                       saved[s] * min(2 - s, b) / b) for s in (0, 1)}
        for gpu, (st, gpipe, one_f_one_b, micro) in gpus.items():
            buckets = ddp_bucket_bytes(st // 4) if dp > 1 else 0  # a quarter of st: the gradients
            rows.append({"dp": dp, "pp": pp, "GPUs": dp * pp, "batch per pipeline": b, "GPU holds": gpu,
                         "params + grads + Adam": st, "DDP buckets": buckets, "activations (GPipe)": gpipe,
                         "activations (1F1B)": one_f_one_b, "activations (micro-batches of 1)": micro,
                         "total (GPipe)": st + buckets + gpipe, "total (1F1B)": st + buckets + one_f_one_b,
                         "total (micro-batches of 1)": st + buckets + micro})
    return rows


guard(globals(), ParallelError)

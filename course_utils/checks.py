"""Checks for the exercises: instant feedback in the notebook, and the grader's scores.

Each ``check_*`` function takes what the learner wrote (a function or a class), runs it on cases
whose right answers are *computed* here from PyTorch (never typed in), prints one line per part
(expected vs got) and returns a ``Report``. A part that raises (``NotImplementedError`` from an
untouched stub, or any bug) scores 0 with the reason; it never stops the other parts.

The checks live here, not in the notebooks, so that editing a notebook cannot change them; the
grader re-imports this module from disk before it runs them.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn


@dataclass
class Part:
    name: str
    points: int
    passed: bool = False
    message: str = ""

    @property
    def score(self) -> int:
        return self.points if self.passed else 0


@dataclass
class Report:
    exercise: str
    parts: list[Part] = field(default_factory=list)

    @property
    def score(self) -> int:
        return sum(p.score for p in self.parts)

    @property
    def max_score(self) -> int:
        return sum(p.points for p in self.parts)

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.parts)

    def as_dict(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "score": self.score, "max_score": self.max_score,
                "parts": [{"name": p.name, "points": p.points, "score": p.score,
                           "message": p.message} for p in self.parts]}


class CheckFailed(AssertionError):
    pass


class Checker:
    """Collects parts; ``with checker.part(name, points):`` runs one, catching its errors."""

    def __init__(self, exercise: str, verbose: bool = True):
        self.report = Report(exercise)
        self.verbose = verbose

    @contextlib.contextmanager
    def part(self, name: str, points: int = 1) -> Iterator[None]:
        part = Part(name, points)
        self.report.parts.append(part)
        try:
            yield
            part.passed, part.message = True, "ok"
        except NotImplementedError as err:
            part.message = f"not implemented yet ({err})" if str(err) else "not implemented yet"
        except CheckFailed as err:
            part.message = str(err)
        except Exception as err:  # the learner's code raised: report, do not stop
            part.message = f"raised {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        if self.verbose:
            mark = "PASS" if part.passed else "FAIL"
            print(f"  [{mark}] {name} ({part.score}/{points})" + ("" if part.passed else f": {part.message}"))

    def done(self) -> Report:
        r = self.report
        if self.verbose:
            print(f"Exercise {r.exercise}: {r.score}/{r.max_score}"
                  + (" -- all parts pass" if r.passed else ""))
        return r


def expect_equal(label: str, got: Any, expected: Any) -> None:
    if got != expected:
        fmt = (lambda v: f"{v:,}") if isinstance(expected, int) and not isinstance(expected, bool) else repr
        try:
            g = fmt(got)
        except (TypeError, ValueError):
            g = repr(got)
        raise CheckFailed(f"{label}: expected {fmt(expected)}, got {g}")


def expect_close(label: str, got: torch.Tensor, expected: torch.Tensor, atol=1e-5, rtol=1e-4) -> None:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{label}: expected a tensor, got {type(got).__name__}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{label}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}")
    if not torch.allclose(got, expected, atol=atol, rtol=rtol):
        err = (got - expected).abs().max().item()
        raise CheckFailed(f"{label}: values differ (max abs error {err:.3g})")


# --------------------------------------------------------------------------------------------
# 00 -- predict a tensor's size
# --------------------------------------------------------------------------------------------
def check_tensor_nbytes(tensor_nbytes: Callable[[tuple[int, ...], torch.dtype], int],
                        verbose: bool = True) -> Report:
    """``tensor_nbytes(shape, dtype)`` must return the bytes a tensor of that shape occupies."""
    c = Checker("00 tensor_nbytes", verbose)
    cases = {
        "float32": [((2, 1, 26, 150, 320), torch.float32), ((3,), torch.float32)],
        "16-bit types": [((2, 64, 26, 150, 320), torch.float16), ((7, 5), torch.bfloat16)],
        "integers and bool": [((4, 4), torch.int64), ((10,), torch.uint8), ((3, 3), torch.bool)],
        "a scalar and an empty tensor": [((), torch.float64), ((0, 5), torch.float32)],
    }
    for name, items in cases.items():
        with c.part(name, 1):
            for shape, dt in items:
                expected = torch.empty(shape, dtype=dt, device="meta").nbytes
                expect_equal(f"tensor_nbytes({shape}, {dt})", tensor_nbytes(shape, dt), expected)
    return c.done()


# --------------------------------------------------------------------------------------------
# 01 -- DoubleConv and Up
# --------------------------------------------------------------------------------------------
def check_double_conv(DoubleConv: type, verbose: bool = True) -> Report:
    """``DoubleConv(in, out)``: (Conv3d 3x3x3 -> BatchNorm3d -> ReLU) x 2, middle = out."""
    from . import unet
    from .unet import count_parameters

    c = Checker("01 DoubleConv", verbose)
    with c.part("parameter counts (1->64, 64->128, 512->512)", 2):
        for cin, cout in ((1, 64), (64, 128), (512, 512)):
            expect_equal(f"params of DoubleConv({cin}, {cout})", count_parameters(DoubleConv(cin, cout)),
                         count_parameters(unet.DoubleConv(cin, cout)))
    with c.part("shape: keeps D, H, W; changes channels", 1):
        out = DoubleConv(2, 6)(torch.randn(2, 2, 5, 6, 7))
        expect_equal("output shape", tuple(out.shape), (2, 6, 5, 6, 7))
    with c.part("has BatchNorm3d and ReLU layers", 1):
        kinds = [type(m) for m in DoubleConv(1, 4).modules()]
        expect_equal("BatchNorm3d layers", kinds.count(nn.BatchNorm3d), 2)
        expect_equal("ReLU layers", kinds.count(nn.ReLU), 2)
    return c.done()


def check_up(Up: type, DoubleConv: type, verbose: bool = True) -> Report:
    """``Up(in, out)``: trilinear x2, pad to the skip, concat [skip, x], DoubleConv(in, out);
    and both seed 000 nets assembled from the learner's blocks have the exact counts."""
    from . import unet
    from .unet import count_parameters

    c = Checker("01 Up", verbose)
    with c.part("odd sizes: upsample, pad to the skip, concat", 2):
        up, ref = Up(96, 32), unet.Up(96, 32)
        deep, skip = torch.randn(1, 64, 3, 4, 5), torch.randn(1, 32, 7, 9, 10)
        expect_equal("output shape", tuple(up(deep, skip).shape), tuple(ref(deep, skip).shape))
        expect_equal("params of Up(96, 32)", count_parameters(up), count_parameters(ref))
    for variant, expected in (("large", 40_158_853), ("small", 14_496_517)):
        with c.part(f"seed 000 {variant} net from your blocks: {expected:,} params", 2):
            cfg = unet.SEED000_VARIANTS[variant]
            enc, dec = cfg["channels"], cfg["decoder_channels"]
            total = count_parameters(DoubleConv(1, enc[0]))
            total += sum(count_parameters(DoubleConv(a, b)) for a, b in zip(enc, enc[1:]))
            below = enc[-1]
            for i, out in enumerate(dec):
                total += count_parameters(Up(below + enc[len(enc) - 2 - i], out))
                below = out
            total += count_parameters(unet.OutConv(below, 5))
            expect_equal("trainable parameters", total, expected)
    return c.done()


# --------------------------------------------------------------------------------------------
# 02 -- a saved-for-backward byte counter
# --------------------------------------------------------------------------------------------
def check_saved_bytes(saved_bytes: Callable, verbose: bool = True) -> Report:
    """``saved_bytes(fn, params=())`` runs ``fn()`` under ``saved_tensors_hooks`` and returns the
    bytes of the distinct storages autograd saved, parameters excluded (see notebook 02)."""
    from .limit_test import LimitTestNet, make_inputs
    from .memory import SavedTensorMeter

    def reference(fn, params=()):
        with SavedTensorMeter(params) as m:
            keep = fn()
        del keep
        return m.peak

    c = Checker("02 saved_bytes", verbose)
    x = torch.randn(1, 1, 8, 8, 8)
    conv = nn.Conv3d(1, 4, 3, padding=1)
    with c.part("conv -> relu", 1):
        fn = lambda: torch.relu(conv(x))
        expect_equal("bytes", saved_bytes(fn, list(conv.parameters())),
                     reference(fn, list(conv.parameters())))
    with c.part("one storage saved twice counts once (seed 003 net)", 2):
        net = LimitTestNet()
        xi, t = make_inputs(8)
        fn = lambda: nn.functional.mse_loss(net(xi), t)
        expect_equal("bytes", saved_bytes(fn, list(net.parameters())),
                     reference(fn, list(net.parameters())))
    with c.part("parameters are not counted", 1):
        lin = nn.Linear(64, 64)
        fn = lambda: lin(torch.randn(2, 64))
        expect_equal("bytes", saved_bytes(fn, list(lin.parameters())),
                     reference(fn, list(lin.parameters())))
    return c.done()


# --------------------------------------------------------------------------------------------
# 03 -- the naive estimate and the largest N for a budget
# --------------------------------------------------------------------------------------------
def check_limit_test(naive_estimate: Callable[[int], int], largest_n: Callable[[int], int],
                     verbose: bool = True) -> Report:
    from .limit_test import naive_bytes, run_limit_test
    from .memory import GiB, largest_that_fits

    c = Checker("03 memory-limit test", verbose)
    with c.part("naive estimate: 26 x the input, fp32", 1):
        for n in (50, 128, 400):
            expect_equal(f"naive_estimate({n})", naive_estimate(n), naive_bytes(n))
    for gib in (1, 4):
        with c.part(f"largest N whose predicted step peak fits {gib} GiB", 2):
            expected = largest_that_fits(lambda k: run_limit_test(k).peak <= gib * GiB, start=8)
            expect_equal(f"largest_n({gib} GiB)", largest_n(gib * GiB), expected)
    return c.done()


# --------------------------------------------------------------------------------------------
# 04 -- autocast + GradScaler
# --------------------------------------------------------------------------------------------
def check_amp_step(amp_step: Callable, verbose: bool = True) -> Report:
    """``amp_step(model, x, y, optimizer, scaler) -> float`` must run the forward under
    ``torch.autocast(x.device.type, dtype=torch.float16)``, scale the loss, step through the
    scaler (which unscales the gradients first) and update the scale."""
    c = Checker("04 amp_step", verbose)
    lr, scale = 0.1, 2.0**10

    def fresh():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    # the reference: same step, done by hand
    ref = fresh()
    with torch.autocast("cpu", dtype=torch.float16):
        out = ref(x)
    nn.functional.cross_entropy(out.float(), y).backward()
    ref_grads = [p.grad.clone() for p in ref.parameters()]
    expected_params = [p.detach() - lr * g for p, g in zip(ref.parameters(), ref_grads)]

    model = fresh()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    dtypes, raw = [], []
    h1 = model[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    h2 = model[0].weight.register_hook(lambda g: raw.append(g.clone()))
    ran = False
    try:
        with c.part("runs and returns the loss as a float", 1):
            loss = amp_step(model, x, y, opt, scaler)
            ran = True
            if not isinstance(loss, float):
                raise CheckFailed(f"expected a Python float (loss.item()), got {type(loss).__name__}")
        with c.part("forward under autocast float16", 1):
            expect_equal("dtype of the first Linear's output", dtypes[0] if dtypes else None,
                         torch.float16)
        with c.part("loss scaled before backward (scaler.scale(loss).backward())", 1):
            if not raw:
                raise CheckFailed("no gradient reached the weights: was backward called?")
            expect_close("raw weight gradient / scale", raw[0] / scale, ref_grads[0], atol=1e-4,
                         rtol=1e-2)
        with c.part("stepped with unscaled gradients (scaler.step) and updated the scale", 1):
            if not ran:
                raise CheckFailed("amp_step did not run")
            for k, (p, e) in enumerate(zip(model.parameters(), expected_params)):
                expect_close(f"parameter {k} after the step", p.detach(), e, atol=1e-4, rtol=1e-2)
            if scaler._per_optimizer_states:
                raise CheckFailed("scaler.update() was not called after scaler.step(optimizer)")
    finally:
        h1.remove()
        h2.remove()
    return c.done()


# --------------------------------------------------------------------------------------------
# 05 -- in-place: which activations, and a broken function fixed
# --------------------------------------------------------------------------------------------
PRECEDING_OPS: dict[str, Callable[[], nn.Module]] = {
    "Conv3d": lambda: nn.Conv3d(2, 2, 3, padding=1),
    "BatchNorm3d": lambda: nn.BatchNorm3d(2),
    "Sigmoid": nn.Sigmoid,
    "Tanh": nn.Tanh,
    "MaxPool3d": lambda: nn.MaxPool3d(2),
    "ReLU": nn.ReLU,
}


def inplace_relu_is_safe_after(op: str) -> bool:
    """Ground truth, by experiment: does ``ReLU(inplace=True)`` after ``op`` break backward?"""
    x = torch.randn(2, 2, 4, 4, 4, requires_grad=True)
    out = nn.ReLU(inplace=True)(PRECEDING_OPS[op]()(x * 1))
    try:
        out.sum().backward()
        return True
    except RuntimeError:
        return False


def check_inplace(answers: Callable[[], dict[str, bool]], fixed: Callable,
                  verbose: bool = True) -> Report:
    """``answers()[op]``: may a ReLU(inplace=True) follow ``op``? ``fixed(x)``: the broken
    ``y = sigmoid(x); y.mul_(2); return y`` rewritten so that backward works."""
    c = Checker("05 in-place", verbose)
    with c.part("which ops may be followed by an in-place ReLU", 3):
        inplace_safe = answers()
        if not isinstance(inplace_safe, dict):
            raise CheckFailed(f"answers() must return a dict op -> bool, got {type(inplace_safe).__name__}")
        missing = sorted(set(PRECEDING_OPS) - set(inplace_safe))
        if missing:
            raise CheckFailed(f"answer every op; missing: {missing}")
        wrong = [op for op in PRECEDING_OPS if bool(inplace_safe[op]) != inplace_relu_is_safe_after(op)]
        if wrong:
            raise CheckFailed(f"wrong for {wrong} (try it: run backward and see)")
    with c.part("fixed(x): same values, working backward, right gradient", 2):
        x = torch.randn(5, requires_grad=True)
        y = fixed(x)
        expect_close("fixed(x)", y, 2 * torch.sigmoid(x.detach()))
        y.sum().backward()
        s = torch.sigmoid(x.detach())
        expect_close("gradient", x.grad, 2 * s * (1 - s))
    return c.done()


# --------------------------------------------------------------------------------------------
# 06 -- the In-Place ABN backward
# --------------------------------------------------------------------------------------------
def check_abn_backward(abn_backward: Callable, verbose: bool = True) -> Report:
    """``abn_backward(z, dz, weight, bias, invstd, slope, training) -> (dx, dweight, dbias)``,
    recovering everything from the output ``z`` (notebook 06)."""
    from .inplace_abn import InPlaceABNFunction

    class LearnerABN(InPlaceABNFunction):
        @staticmethod
        def backward(ctx, dz):
            z, weight, bias, invstd = ctx.saved_tensors
            dx, dw, db = abn_backward(z, dz, weight, bias, invstd, ctx.slope, ctx.training)
            return dx, dw, db, None, None, None, None, None, None

    c = Checker("06 abn_backward", verbose)
    for training in (True, False):
        with c.part(f"gradcheck in float64, {'train' if training else 'eval'} mode", 2):
            torch.manual_seed(0)
            x = torch.randn(3, 2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
            w = (torch.rand(2, dtype=torch.float64) + 0.5).requires_grad_()
            b = torch.randn(2, dtype=torch.float64, requires_grad=True)
            rm, rv = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
            f = lambda x, w, b: LearnerABN.apply(x.clone(), w, b, rm.clone(), rv.clone(), training,
                                                 0.1, 1e-5, 0.1)
            try:
                ok = torch.autograd.gradcheck(f, (x, w, b), raise_exception=True)
            except torch.autograd.gradcheck.GradcheckError as err:
                raise CheckFailed(str(err).splitlines()[0][:200]) from None
            expect_equal("gradcheck", ok, True)
    with c.part("equals BatchNorm3d + LeakyReLU gradients", 2):
        torch.manual_seed(1)
        bn, act = nn.BatchNorm3d(4), nn.LeakyReLU(0.01)
        x = torch.randn(2, 4, 3, 4, 5)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        w2, b2 = bn.weight.detach().clone().requires_grad_(), bn.bias.detach().clone().requires_grad_()
        act(bn(x1)).sum().backward()
        LearnerABN.apply(x2 * 1, w2, b2, torch.zeros(4), torch.ones(4), True, 0.1, 1e-5, 0.01).sum().backward()
        expect_close("d input", x2.grad, x1.grad)
        expect_close("d weight", w2.grad, bn.weight.grad)
        expect_close("d bias", b2.grad, bn.bias.grad)
    return c.done()


# --------------------------------------------------------------------------------------------
# 07 -- checkpoint the encoder; pick the segment count
# --------------------------------------------------------------------------------------------
def check_checkpointed_encoder(encoder_forward: Callable, verbose: bool = True) -> Report:
    """``encoder_forward(net, x) -> list[Tensor]``: the skip tensors of ``net.inc`` and each
    ``net.downs[k]``, every block run under ``torch.utils.checkpoint`` (non-reentrant)."""
    from .memory import SavedTensorMeter
    from .parallel import EncoderStage
    from .unet import UNet3D

    c = Checker("07 checkpointed encoder", verbose)
    torch.manual_seed(0)
    net = UNet3D(levels=3, channels=4)
    x = torch.randn(2, 1, 8, 8, 8)

    encoder = [(f"inc.{n}", p) for n, p in net.inc.named_parameters()]
    encoder += [(f"downs.{n}", p) for n, p in net.downs.named_parameters()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    with SavedTensorMeter(net.parameters()) as m_ref:
        ref = EncoderStage(net)(x)
    sum(s.sum() for s in ref).backward()
    ref_grads = [p.grad.clone() for _, p in encoder]
    net.load_state_dict(state)
    net.zero_grad()
    outs = None
    with c.part("same skip tensors as without checkpointing", 1):
        with SavedTensorMeter(net.parameters()) as m:
            outs = encoder_forward(net, x)
        expect_equal("number of skip tensors", len(outs), len(ref))
        for k, (a, b) in enumerate(zip(outs, ref)):
            expect_close(f"skip {k}", a, b.detach())
    with c.part("same gradients", 1):
        if outs is None:
            raise CheckFailed("encoder_forward did not run")
        sum(s.sum() for s in outs).backward()
        for (name, p), g in zip(encoder, ref_grads):
            expect_close(f"grad of {name}", p.grad, g)
    with c.part("stores less for backward (checkpoint used)", 1):
        if outs is None:
            raise CheckFailed("encoder_forward did not run")
        if not m.peak < 0.5 * m_ref.peak:
            raise CheckFailed(f"saved {m.peak:,} B vs {m_ref.peak:,} B without checkpointing: wrap "
                              "each block in checkpoint(block, x, use_reentrant=False)")
    return c.done()


@functools.lru_cache(maxsize=None)
def best_segment_count(n_layers: int) -> frozenset[int]:
    """The divisors s of n_layers with the lowest predicted peak for ``SegmentedStack``."""
    from .checkpointing import SegmentedStack, deep_stack
    from .memory import predict_step

    peaks = {s: predict_step(lambda s=s: SegmentedStack(deep_stack(n_layers, 8), s),
                             (1, 1, 16, 16, 16), n_classes=5, optimizer=None).peak
             for s in range(1, n_layers + 1) if n_layers % s == 0}
    low = min(peaks.values())
    return frozenset(s for s, v in peaks.items() if v == low)


def check_segments(best_segments: Callable[[int], int], verbose: bool = True) -> Report:
    """``best_segments(n)``: the segment count (a divisor of n) with the lowest peak for an
    n-layer conv -> BN -> ReLU(inplace) stack under ``checkpoint_sequential``."""
    c = Checker("07 segment count", verbose)
    for n in (8, 18):
        with c.part(f"{n} layers", 1):
            expected = best_segment_count(n)
            got = best_segments(n)
            if got not in expected:
                raise CheckFailed(f"best_segments({n}): expected {sorted(expected)}, got {got}")
    return c.done()


# --------------------------------------------------------------------------------------------
# 08 -- a DDP step that matches the single-process gradient
# --------------------------------------------------------------------------------------------
def check_ddp_step(ddp_step: Callable, verbose: bool = True) -> Report:
    """``ddp_step(model, x, y, rank, world) -> list of gradients``: take this rank's shard of the
    global batch, wrap the model in DDP, one forward/backward. Run on 2 gloo processes."""
    import inspect
    import textwrap

    from .parallel import launch, single_process_grads, source_worker

    c = Checker("08 ddp_step", verbose)
    ranks = None
    with c.part("runs on 2 processes", 1):
        try:
            source = textwrap.dedent(inspect.getsource(ddp_step))
        except (OSError, TypeError):
            raise CheckFailed("cannot read the source of ddp_step: define it with def in a cell") from None
        config = {"source": source, "name": ddp_step.__name__, "norm": "gn", "global_batch": 4}
        try:
            ranks = launch(source_worker, 2, config, timeout_s=120)
        except RuntimeError as err:
            last = [ln for ln in str(err).splitlines() if ln.strip()]
            raise CheckFailed(f"a rank failed: {last[-1][:200] if last else err}") from None
    with c.part("each rank uses only its half of the batch", 1):
        if ranks is None:
            raise CheckFailed("did not run")
        expect_equal("batch seen by the model on rank 0", ranks[0]["batch_seen"], [2])
    with c.part("gradients equal the single-process gradient on the whole batch", 2):
        if ranks is None:
            raise CheckFailed("did not run")
        ref = single_process_grads({"norm": "gn", "global_batch": 4})
        for r in ranks:
            if len(r["grads"]) != len(ref):
                raise CheckFailed(f"expected {len(ref)} gradients (one per parameter), got {len(r['grads'])}")
            for k, (g, e) in enumerate(zip(r["grads"], ref)):
                expect_close(f"rank {r['rank']}, gradient {k}", g, e, atol=1e-5, rtol=1e-3)
    return c.done()


# --------------------------------------------------------------------------------------------
# 09 -- split the U-Net into two stages
# --------------------------------------------------------------------------------------------
def check_split(split_unet: Callable, verbose: bool = True) -> Report:
    """``split_unet(net) -> (stage1, stage2)``: ``stage1(x)`` returns the list of skip tensors,
    ``stage2(skips)`` the logits; together exactly ``net``."""
    from .unet import UNet3D

    c = Checker("09 split_unet", verbose)
    torch.manual_seed(0)
    net = UNet3D(levels=3, channels=4)
    x = torch.randn(2, 1, 8, 8, 8)
    ref = net(x)
    ref.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad()
    stages = None
    with c.part("the two stages share no parameter and together hold them all", 1):
        stages = split_unet(net)
        s1, s2 = ({id(p) for p in s.parameters()} for s in stages)
        if s1 & s2:
            raise CheckFailed(f"{len(s1 & s2)} parameters are in both stages")
        expect_equal("parameters in the two stages", len(s1 | s2), len(list(net.parameters())))
    with c.part("stage2(stage1(x)) equals net(x)", 2):
        if stages is None:
            raise CheckFailed("split_unet did not run")
        out = stages[1](stages[0](x))
        expect_close("output", out, ref.detach())
    with c.part("the gradients equal the unsplit net's", 1):
        if stages is None:
            raise CheckFailed("split_unet did not run")
        out.sum().backward()
        for n, p in net.named_parameters():
            expect_close(f"grad of {n}", p.grad, ref_grads[n])
    return c.done()


# --------------------------------------------------------------------------------------------
# 10 -- beat the budget challenge
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def best_safe_batch(budget_gib: int = 8) -> int:
    """The largest batch of any autocast-fp16 configuration (fp32 master weights) of seed 000's
    net at 26x150x320 within the budget; bf16 needs the same memory and fp32 more."""
    from . import explorer as ex

    base = ex.Config(budget_gib=budget_gib)
    return max(ex.estimate(cfg).largest_batch
               for cfg in ex.all_combinations(base, precisions=["autocast fp16"]))


def check_budget(my_config: Callable, verbose: bool = True) -> Report:
    """``my_config() -> explorer.Config`` for seed 000's large net at 26x150x320 with fp32 master
    weights, fitting the largest batch in 8 GiB."""
    from . import explorer as ex
    from .config import SEED000_VOLUME

    c = Checker("10 budget challenge", verbose)
    cfg = None
    with c.part("a valid configuration of seed 000's net, fp32 master weights", 1):
        cfg = my_config()
        if not isinstance(cfg, ex.Config):
            raise CheckFailed(f"return a course_utils.explorer.Config, got {type(cfg).__name__}")
        expect_equal("volume", tuple(cfg.volume), SEED000_VOLUME)
        expect_equal("(levels, base_channels)", (cfg.levels, cfg.base_channels), (5, 64))
        expect_equal("budget_gib", cfg.budget_gib, 8)
        if cfg.precision == "fp16 model (seed 000)":
            raise CheckFailed("the fp16-built model has no fp32 master weights (notebook 04): use autocast")
        ex.estimate(cfg)  # raises for invalid combinations
    with c.part("beats the baseline (batch 3 for the fp16 model)", 1):
        if cfg is None:
            raise CheckFailed("no configuration")
        got = ex.estimate(replace_batch(cfg)).largest_batch
        if got <= ex.estimate(ex.Config()).largest_batch:
            raise CheckFailed(f"largest batch {got}: no better than the seed's setup")
    with c.part("matches the best safe configuration", 2):
        if cfg is None:
            raise CheckFailed("no configuration")
        expect_equal("largest batch in 8 GiB", ex.estimate(replace_batch(cfg)).largest_batch, best_safe_batch(8))
    return c.done()


def replace_batch(cfg, batch: int = 1):
    from dataclasses import replace

    return replace(cfg, batch=batch, dp_ranks=1)


# --------------------------------------------------------------------------------------------
# The registry: which check grades which exercise, and on which names the learner defines
# --------------------------------------------------------------------------------------------
EXERCISES: dict[str, list[tuple[str, list[str]]]] = {
    "00": [("check_tensor_nbytes", ["tensor_nbytes"])],
    "01": [("check_double_conv", ["DoubleConv"]), ("check_up", ["Up", "DoubleConv"])],
    "02": [("check_saved_bytes", ["saved_bytes"])],
    "03": [("check_limit_test", ["naive_estimate", "largest_n"])],
    "04": [("check_amp_step", ["amp_step"])],
    "05": [("check_inplace", ["answers", "fixed"])],
    "06": [("check_abn_backward", ["abn_backward"])],
    "07": [("check_checkpointed_encoder", ["encoder_forward"]), ("check_segments", ["best_segments"])],
    "08": [("check_ddp_step", ["ddp_step"])],
    "09": [("check_split", ["split_unet"])],
    "10": [("check_budget", ["my_config"])],
}


class Missing:
    """Stands in for a name the learner did not define: every use raises a NameError that says
    so, so each part of the check fails with that reason and the maximum score stays the same."""

    def __init__(self, name: str):
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any):
        raise NameError(f"{self._name} is not defined: run the cell that defines it")

    __call__ = __getitem__ = __iter__ = __contains__ = __len__ = _fail

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        self._fail()


def run_exercise(nn_id: str, namespace: dict[str, Any], verbose: bool = False) -> list[Report]:
    """Run every check of exercise ``nn_id`` on the learner's ``namespace``."""
    if nn_id not in EXERCISES:
        raise KeyError(f"no exercise {nn_id!r}; known: {sorted(EXERCISES)}")
    reports = []
    for check_name, names in EXERCISES[nn_id]:
        args = [namespace.get(n, Missing(n)) for n in names]
        reports.append(globals()[check_name](*args, verbose=verbose))
    return reports

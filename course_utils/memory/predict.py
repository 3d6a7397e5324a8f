"""The GPU-free predictor: ``predict_step`` runs the course's training step under ``MemoryLog``
on ``FakeTensorMode`` tensors (``Prediction``: peak, breakdown, method); ``measure_step`` runs the
same step on a real GPU and reads the caching allocator.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Sequence

import torch
from torch import nn

from ..amp_rules import autocast_rules
from ..checks import CourseError, MeasureError, guard
from ..loops import Loop, prime_optimizer
from ..train import require_data, training_step
from .cuda import CudaPeak, cuda_peak, require_cuda
from .meters import SavedTensorMeter
from .units import mib

if TYPE_CHECKING:  # hook_table imports MemTracker (torch.distributed, dynamo): on first use only
    from .hook_table import MemoryLog


#: the most elements a shape may hold (1 PiB in fp32): a step's tensors grow from it (a convolution's
#: channels), and torch's sizes overflow at 2**63 bytes
MAX_ELEMENTS = 2**48


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in ``dtype`` (``.to(dtype)`` fails on fake parameters); restores the old one."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)



@dataclass
class Prediction:
    """A predicted (or CPU-measured) training step: peak live bytes and what they are made of."""

    peak: int  # bytes: the predicted torch.cuda.max_memory_allocated() of the step
    breakdown: dict[str, int]  # bytes per category at the peak
    saved_peak: int  # saved-for-backward bytes (saved_tensors_hooks), at their maximum
    after_forward: dict[str, int]  # bytes per category when the model's forward returns
    parameters: int  # number of parameters
    log: MemoryLog | None = field(repr=False)  # None where a cached copy dropped it (densenet)
    steady_state: bool = True
    target: str = "cuda"
    method: str = "predicted (MemTracker under FakeTensorMode)"

    def mib(self) -> dict[str, float]:
        return {k: round(mib(v), 1) for k, v in self.breakdown.items()}

    @property
    def kept_after_forward(self) -> int:
        """Activation bytes alive when the forward returns: everything kept for backward
        (saved tensors, checkpoint inputs, selectively saved outputs) and the logits."""
        return self.after_forward["Activation"]

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in self.mib().items() if k != "Total" and v)
        return f"peak {mib(self.peak):,.0f} MiB [{self.method}]: {parts}"


def method_label(fake: bool, steady_state: bool, target: str, autocast: bool) -> str:
    """How a figure was obtained, in words: the label every table prints."""
    step = "steady-state step" if steady_state else "first step"
    if fake:
        rules = f", {target.upper() if target == 'cuda' else 'CPU'} autocast rules" if autocast else ""
        where = "for a CUDA GPU" if target == "cuda" else "for the CPU"
        return f"predicted {where} (MemTracker under FakeTensorMode; {step}{rules})"
    rules = ", CPU autocast rules" if autocast else ""
    return f"measured on CPU tensors (MemTracker; {step}{rules})"


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """While active, ``F.dropout`` / ``torch.dropout`` run as on a CUDA tensor: ATen's
    ``dropout`` takes the fused kernel there (``native_dropout``, which keeps a **bool** mask for
    backward: 1 byte per element) where a CPU multiplies by a noise tensor it keeps in the
    input's dtype (4 bytes per element in fp32) -- aten/src/ATen/native/Dropout.cpp,
    ``is_fused_kernel_acceptable``: a CUDA input, 0 < p < 1, not empty, not in place. In-place
    and feature dropout (``Dropout2d``/``3d``) take the same path on both. Not reentrant."""
    lib = torch.library.Library("aten", "IMPL")

    def dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        if train and 0 < p < 1 and input.numel() > 0:
            return torch.native_dropout(input, p, train)[0]
        if not train or p == 0 or input.numel() == 0:
            return input
        return input * torch.zeros((), dtype=input.dtype, device=input.device)  # p == 1, as ATen

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            lib.impl("dropout", dropout, "CompositeImplicitAutograd")
        yield
    finally:
        lib._destroy()


def adopt_fake_tensors(model: nn.Module) -> None:
    """Parameters and buffers copied with ``copy.deepcopy`` inside ``FakeTensorMode`` (as
    ``nn.TransformerEncoder`` copies its layer) belong to another fake mode, which the active one
    refuses ("Mixing fake modes"), and those of a model built on the meta device (``with
    torch.device("meta"):``, to build a large model without memory) are on another device than the
    batch: replace them by tensors of the active mode on its device (values do not matter, shapes
    and dtypes do; tied tensors stay tied). A real tensor (a model built before, outside the mode)
    is refused with a ``MeasureError`` that names it and the fix."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode = getattr(torch.empty(0), "fake_mode", None)
    if mode is None:
        return
    for path, m in model.named_modules():
        for store in (m._parameters, m._buffers):
            for name, t in store.items():
                if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
                    raise MeasureError(
                        f"the {type(model).__name__}'s {f'{path}.' if path else ''}{name} is a real tensor, not "
                        "a fake one (shapes only, no memory): the model was built before the prediction, or that "
                        "tensor was made outside the builder.",
                        "pass a function that builds a new model, e.g. `lambda: MyNet(...)`, not `lambda: model`, "
                        "and make every tensor inside it (a constant with torch.tensor(...) in __init__).")
    _replace_tensors(model, lambda t: t.fake_mode is not mode or t.is_meta)


def _replace_tensors(model: nn.Module, stale: Callable[[torch.Tensor], bool]) -> None:
    """Each parameter and buffer for which ``stale(t)`` is True replaced by a tensor of its shape,
    stride and dtype made in the active mode (tied tensors stay tied)."""
    new: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for store in (m._parameters, m._buffers):
            for name, t in list(store.items()):
                if t is not None and stale(t):
                    if id(t) not in new:
                        fresh = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype)
                        if isinstance(t, nn.Parameter):
                            fresh = nn.Parameter(fresh, requires_grad=t.requires_grad)
                        new[id(t)] = fresh
                    store[name] = new[id(t)]


def build_fake(build_model: Callable[[], Any]) -> Any:
    """``build_model()`` inside the active ``FakeTensorMode`` (or none: then as it is). A builder
    that makes its model on the meta device and that the fake mode refuses (``BatchNorm``'s
    counter, ``torch.tensor(0)``, is a real meta tensor there) runs again outside the fake mode,
    where a meta model allocates nothing, and its meta tensors become fake ones. A ``.to()``
    inside the builder, which fake parameters refuse ("Couldn't swap"), is a ``MeasureError``."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        return build_model()
    except RuntimeError as e:
        if "Couldn't swap" not in str(e):
            raise
        raise MeasureError(f"the builder converts or moves the model ({e}): fake tensors cannot be swapped.",
                           "build the model where and as it runs, without .to(), .cuda(), .half() or .double() "
                           "(dtype=... builds it in another dtype; `with torch.device('meta'):` builds a large "
                           "model without memory).") from None
    except AssertionError as e:  # FakeTensorMode's "Please convert all Tensors to FakeTensors first"
        if "FakeTensors" not in str(e) or "device='meta'" not in str(e):
            raise
    with unset_fake_temporarily():
        model = build_model()
    if isinstance(model, nn.Module):
        _replace_tensors(model, lambda t: t.is_meta)
    return model


def _check_builder(build_model: Any) -> None:
    if isinstance(build_model, nn.Module):
        raise MeasureError(
            "predict_step takes a function that builds the model, not a model: it must build it "
            "inside FakeTensorMode, in the requested dtype.",
            "pass e.g. `lambda: seed000_unet('large')` instead of the model itself.")
    if not callable(build_model):
        raise MeasureError(f"build_model must be a function returning an nn.Module, got {type(build_model).__name__}.",
                           "pass e.g. `lambda: MyNet(...)`.")


def _check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A shape: whole numbers (NumPy's too: a shape computed with NumPy), each >= 1; as ints."""
    bad = isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable)
    dims = () if bad else tuple(shape)
    if bad or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in dims):
        raise MeasureError(f"{name} must be a sequence of whole numbers, got {shape!r}.",
                           f"pass {name} as a tuple, batch first, e.g. (2, 1, 64, 64, 64).")
    dims = tuple(int(s) for s in dims)
    if not dims or any(s < 1 for s in dims):
        raise MeasureError(f"{name} {dims}: every size (batch included) must be >= 1.",
                           f"pass {name} batch first, every size >= 1, e.g. (2, 1, 64, 64, 64).")
    if math.prod(dims) > MAX_ELEMENTS:
        raise MeasureError(f"{name} {dims} holds {math.prod(dims):.3g} elements, more than any GPU holds (and "
                           "beyond torch's sizes once a layer widens it).",
                           f"pass the shape of one step's batch, at most {MAX_ELEMENTS:,} elements (1 PiB in fp32).")
    return dims


def target_spec(input_shape: tuple[int, ...], target_shape: Sequence[int] | None,
                 n_classes: int | None, loss_fn: Callable | None) -> tuple[bool, tuple[int, ...], Callable]:
    """The target a step trains against: class indices (the input's shape without the channel
    dim; cross-entropy) unless a ``target_shape`` without ``n_classes`` asks for floats (MSE)."""
    classify = n_classes is not None or target_shape is None
    if target_shape is None:
        target_shape = (input_shape[0], *input_shape[2:])
    target_shape = _check_shape("target_shape", target_shape)
    if target_shape[0] != input_shape[0]:
        raise MeasureError(f"target_shape {target_shape} and input_shape {input_shape} have different batches.",
                           "give the target the input's batch as its first size (or leave target_shape out: class "
                           "indices of the input's shape without its channels).")
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy if classify else nn.functional.mse_loss
    return classify, target_shape, loss_fn


@contextlib.contextmanager
def _step_failures(input_shape: tuple[int, ...], fake: bool) -> Iterator[None]:
    """A failure of the step that is not the course's own error (the model refuses the shape, has
    no parameters for the optimizer, reads tensor values...) as a ``MeasureError`` that names the
    input shape and the fix; the original is its ``__cause__`` (``fit`` reads it to say more)."""
    try:
        yield
    except CourseError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise MeasureError(
            f"the step failed on {'fake' if fake else 'CPU'} tensors of input shape {input_shape} "
            f"({type(e).__name__}: {first}).",
            "check that the input shape is what the model expects (batch first, then channels and sizes) and "
            "that build_model() returns the model with its parameters; course_utils.fit.fit(build_model, "
            "input_shape) says more (a model that reads tensor values or needs a real CUDA device cannot run "
            "on fake tensors), or measure the step on a GPU with measure_step.") from e


def predict_step(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    target_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    loss_fn: Callable | None = None,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | str | None = "adam",
    autocast_dtype: torch.dtype | None = None,
    n_classes: int | None = None,
    fake: bool = True,
    module_peaks: bool = True,
    steady_state: bool = True,
    target: Literal["cuda", "cpu"] | None = None,
    loop: Loop | None = None,
) -> Prediction:
    """Predict the memory of one training step (``train.training_step``) without running it.

    The model is built by ``build_model()`` (so it can be built *inside* ``FakeTensorMode``,
    in ``dtype``) and trained on fake data of ``input_shape``. The target is class indices of
    ``target_shape`` (default: the input's shape without the channel dim, with ``n_classes``
    classes -> cross-entropy) or, if ``n_classes`` is None and ``target_shape`` is given, a float
    tensor (-> MSE). ``optimizer``: "adam", "sgd", None (no step) or a factory.

    * ``steady_state=True`` (default): the step of a running loop (step 2 and later), whose
      optimizer state already exists; ``False``: the very first step, where Adam creates its
      state only in ``optimizer.step()``, after the backward pass.
    * ``target``: whose rules the step follows. ``"cuda"`` (default for ``fake=True``): CUDA's
      autocast op lists (``amp_rules``), Adam's foreach implementation (the default on CUDA),
      dropout's fused kernel and its bool mask (``cuda_dropout``), and the caching allocator's
      512-byte blocks. ``"cpu"`` (the only choice for
      ``fake=False``): what this CPU does.
    * ``module_peaks=False`` skips MemTracker's per-module peak bookkeeping (about half its
      cost); the global peak and breakdown are unchanged.
    * ``loop``: a ``loops.Loop`` (its optimizer, kept gradients, accumulation, optimizer in
      backward, forward-only modes, the output the loss takes) instead of ``optimizer``, which
      must then be left at its default. With ``accumulate=K`` two micro-batches run: the third
      and later ones hold what the second holds.

    With ``fake=False`` the same step runs on real CPU tensors: with ``target="cpu"`` the figures
    agree exactly with the fake ones (a test checks this), which is what makes the prediction
    trustworthy.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    _check_builder(build_model)
    input_shape = _check_shape("input_shape", input_shape)
    if len(input_shape) < 2:
        raise MeasureError(f"input_shape needs at least (batch, channels), got {input_shape}.",
                           "pass the batch first, then the channels and the sizes, e.g. (2, 1, 64, 64, 64).")
    target = target or ("cuda" if fake else "cpu")
    if target == "cuda" and not fake:
        raise MeasureError("real CPU tensors follow the CPU's rules.",
                           "use target='cpu' with fake=False, or measure_step() on a GPU.")
    if loop is not None and optimizer != "adam":
        raise MeasureError("predict_step takes the optimizer from loop= when a loop is given.",
                           f"leave optimizer out, or name it in the loop (Loop(optimizer={optimizer!r})).")
    classify, target_shape, loss_fn = target_spec(input_shape, target_shape, n_classes, loss_fn)

    # the same starting state every time: Python's garbage collector frees cyclic garbage (some
    # of it holds tensors, e.g. under checkpointing) at moments set by its allocation counters;
    # collecting first makes those moments, and so the prediction, independent of what ran before.
    # The young generations are enough: a collection of generation 1 resets the counters that time
    # the collections during the step (the step's own garbage is young), and skips the oldest
    # generation, which holds everything torch, pandas and Jupyter loaded: a full collection took
    # 0.11 s of seed 003's 0.16 s prediction in a notebook-sized process (0.9 s of 1.4 s for seed
    # 000's large U-Net), the same predictions with generation 1 take 0.025 s and 0.56 s
    import gc

    # lazy: MemTracker's import costs 1.8 CPU-s, paid only by a prediction (memory.__init__)
    from .hook_table import _check_model_and_input, log_step

    gc.collect(1)
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    dropout = cuda_dropout() if target == "cuda" else contextlib.nullcontext()
    with default_dtype(dtype), mode, autocast_rules(target if autocast_dtype else None), dropout, \
            _step_failures(input_shape, fake):
        model = build_fake(build_model)
        _check_model_and_input(model, torch.empty(0))
        adopt_fake_tensors(model)  # (real tensors, fake=False: nothing to do)
        if not fake:
            require_data(model, where="predict_step(fake=False)")
        x = torch.randn(input_shape)
        if loop is not None and loop.mode == "inference":
            y = None  # inference has no target
        elif classify:
            y = torch.randint(0, n_classes or 2, target_shape)
        else:
            y = torch.randn(target_shape)
        if loop is None:
            opt = make_optimizer(optimizer, model, foreach=target == "cuda")
            if steady_state and opt is not None:
                prime_optimizer(model, opt)
        else:
            opt = loop.make_optimizer(model, default_foreach=target == "cuda")
            if steady_state:
                loop.prime(model, opt)
        log = log_step(model, x, y, loss_fn, opt, autocast_dtype, module_peaks,
                       round_like_cuda=target == "cuda", loop=loop)
        n_params = sum(p.numel() for p in model.parameters())
    return Prediction(
        peak=log.peak, breakdown=log.breakdown("peak"), saved_peak=log.saved.peak,
        after_forward=log.after_forward or {}, parameters=n_params, log=log,
        steady_state=steady_state, target=target,
        method=method_label(fake, steady_state, target, autocast_dtype is not None),
    )


def make_optimizer(spec: Any, model: nn.Module, foreach: bool = False) -> torch.optim.Optimizer | None:
    """The optimizer ``spec`` names for ``model``: None, "adam" (lr 1e-3), "sgd" (lr 1e-2,
    momentum 0.9), or a factory called with the parameters."""
    if spec is None:
        return None
    if callable(spec):
        return spec(model.parameters())
    if spec == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
    if spec == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=foreach)
    raise MeasureError(f"optimizer must be 'adam', 'sgd', None or a factory, got {spec!r}.",
                       "e.g. optimizer='sgd', or a factory: lambda params: torch.optim.AdamW(params).")


def step_parts(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    target_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    loss_fn: Callable | None = None,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | str | None = "adam",
    n_classes: int | None = None,
    device: str | torch.device = "cuda",
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.optim.Optimizer | None, Callable]:
    """What ``measure_step`` trains, on real tensors on ``device``: ``(model, x, y, optimizer,
    loss_fn)``, with the target and loss ``predict_step`` would pick for the same arguments and
    the optimizer's multi-tensor (foreach) implementation, CUDA's default. The model is built in
    ``dtype`` on the CPU and moved; the batch is created on ``device``."""
    _check_builder(build_model)
    input_shape = _check_shape("input_shape", input_shape)
    classify, target_shape, loss_fn = target_spec(input_shape, target_shape, n_classes, loss_fn)
    dev = torch.device(device)
    with default_dtype(dtype):
        model = build_model()
    if any(t.device != dev for t in (*model.parameters(), *model.buffers())):
        model = model.to(dev)  # (a model built on the device already, fake tensors' among them, stays as it is)
    x = torch.randn(input_shape, device=dev, dtype=dtype)
    y = (torch.randint(0, n_classes or 2, tuple(target_shape), device=dev) if classify
         else torch.randn(tuple(target_shape), device=dev, dtype=dtype))
    return model, x, y, make_optimizer(optimizer, model, foreach=True), loss_fn


def measure_step(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    target_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    loss_fn: Callable | None = None,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | str | None = "adam",
    autocast_dtype: torch.dtype | None = None,
    n_classes: int | None = None,
    steady_state: bool = True,
    device: str | torch.device = "cuda",
    instrument: Any = None,
) -> CudaPeak:
    """``predict_step``'s twin on a real GPU: the same ``training_step`` on real CUDA tensors,
    read from the caching allocator (``max_memory_allocated`` / ``max_memory_reserved`` of the
    measured step; with ``steady_state`` the second step, after an unmeasured first one).
    The model is built in ``dtype`` on the CPU and moved; the batch is created on the GPU.

    ``instrument``: a dispatch mode entered around the measured step only, e.g.
    ``transients.OpTransients`` (what each op keeps and needs while it runs); the peaks returned
    are then the larger of the allocator's and the instrument's own (``OpTransients`` resets the
    allocator's peak statistics at every op)."""
    require_cuda("measure_step")
    dev = torch.device(device)
    model, x, y, opt, loss_fn = step_parts(build_model, input_shape, target_shape, dtype=dtype, loss_fn=loss_fn,
                                           optimizer=optimizer, n_classes=n_classes, device=dev)
    meter = SavedTensorMeter(model.parameters())
    marks: dict[str, int] = {}
    pre = model.register_forward_pre_hook(lambda *a: marks.__setitem__("pre", torch.cuda.memory_allocated()))
    post = model.register_forward_hook(lambda *a: marks.__setitem__("post", torch.cuda.memory_allocated()))

    def step(measured: bool = False) -> None:
        with meter, (instrument if measured and instrument is not None else contextlib.nullcontext()):
            training_step(model, x, y, opt, loss_fn=loss_fn, autocast_dtype=autocast_dtype)

    try:
        if steady_state:
            step()
        torch.cuda.synchronize(dev)
        meter.peak = meter.current
        result = cuda_peak(lambda: step(measured=True), baseline=False, device=dev)
    finally:
        pre.remove()
        post.remove()
    if instrument is not None:
        result.peak_allocated = max(result.peak_allocated, getattr(instrument, "peak", 0))
        result.peak_reserved = max(result.peak_reserved, getattr(instrument, "peak_reserved", 0))
    result.saved_peak = meter.peak
    result.kept_after_forward = marks["post"] - marks["pre"]
    result.allocated_after_forward = marks["post"]
    result.method = ("measured (cuda max_memory_allocated / max_memory_reserved; "
                     + ("steady-state step)" if steady_state else "first step)"))
    model = opt = x = y = None  # this frame's references go (step's closure shares these cells)
    return result


guard(globals(), MeasureError)

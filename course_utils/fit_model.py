"""The learner's network as ``fit`` sees it: named, checked, built on fake tensors, changed by a technique.

* ``resolve_builder`` / ``resolve_function`` / ``parse_shape`` / ``loss_function`` /
  ``parse_techniques`` / ``parse_capability`` -- the CLI's and ``fit``'s inputs checked
  (``MODULE:BUILDER``, ``MODULE:LOSS``, ``8,1,512,512``, ``ddp-2,inplace``, ``9.0``); ``FitError``
  names the fix for anything ``fit`` cannot predict.
* ``target_for`` / ``check_loss`` -- the target a loss needs for the model's output, and the loss
  run on both (fake tensors): a mismatch is a ``FitError`` that names the option to give.
* ``build_model`` -- ``build()`` inside the active ``FakeTensorMode``, checked (an ``nn.Module`` with
  a forward, its tensors of the active mode; a model built on the meta device gets fake tensors of
  its shapes); ``check_trainable`` -- parameters for the loop to train; ``explain_failure`` says why
  a model cannot run on fake tensors (it reads tensor values, needs a real CUDA device, or its
  backward fails on an in-place op) and what to do.
* ``blocks`` -- the model's blocks (checkpointing's and FSDP's units), found from its structure.
* ``variant`` -- a builder of the model with a technique applied: ``inplace`` activations,
  ``checkpoint-blocks``, ``selective`` (``save_matmuls``), ``offload``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import warnings
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .checks import FitError, MeasureError, guard
from torch.nn import functional as F

from .checkpointing import checkpointed, offload_saved, save_convolutions
from .loops import Loop
from .memory import MAX_ELEMENTS, SavedTensorModifiedError, adopt_fake_tensors, build_fake

_DATA_FIX = ("Fix: remove data-dependent branches from forward (no .item(), .tolist(), .numpy(), no Python "
             "`if` on a tensor's value, no nonzero/boolean-mask indexing: use torch.where and fixed shapes), "
             "or measure the step on a GPU with course_utils.memory.measure_step.")
_CUDA_FIX = ("Fix: make tensors on the input's device (device=x.device, or register them as buffers) instead "
             "of 'cuda', and call no torch.cuda API in __init__ or forward; or measure the step on a GPU with "
             "course_utils.memory.measure_step.")
_INPLACE_FIX = ("Fix: make the op that overwrites it out of place (inplace=False on the activation after it: e.g. an "
                "nn.ELU(inplace=True) after a ReLU overwrites the output ReLU's backward needs), or y = x + 1 "
                "for x += 1; PyTorch refuses this backward on a GPU too.")

#: the losses the CLI knows, by name; ``loss=`` also takes MODULE:FUNCTION or a callable(output, target)
LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": F.cross_entropy,
    "mse": F.mse_loss,
    "bce": F.binary_cross_entropy_with_logits,
}
RANKS = (2, 4, 8)
TECHNIQUES = ("autocast-fp16", "autocast-bf16", "inplace", "checkpoint-blocks", "selective", "offload",
              *(f"ddp-{n}" for n in RANKS), *(f"fsdp-{n}" for n in RANKS))


def resolve_builder(spec: str | Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``"package.module:function"`` (or a callable) -> the builder function."""
    if isinstance(spec, nn.Module):
        raise FitError("fit takes a function that builds the model, not a model (it builds it on fake "
                       f"tensors). Fix: pass e.g. `lambda: {type(spec).__name__}(...)`.")
    return resolve_function(spec, "BUILDER", "course_utils.fit_examples:resnet18_2d", "returns an nn.Module")


def resolve_function(spec: str | Callable, kind: str, example: str, does: str) -> Callable:
    """``"package.module:function"`` (or a callable) -> the callable; ``kind`` / ``example`` /
    ``does`` word the errors (e.g. "LOSS", "mypkg.losses:dice", "takes (output, target)")."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise FitError(f"expected MODULE:{kind} (e.g. {example}), got {spec!r}. "
                       f"Fix: name an importable module and a function in it that {does}.")
    mod_name, attr = spec.split(":")
    try:
        module = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or an error while the module runs
        raise FitError(f"cannot import {mod_name!r} ({type(e).__name__}: {e}). Fix: run from the folder that "
                       "holds it or add that folder to PYTHONPATH, and check the module's name.") from e
    try:
        obj = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise FitError(f"{mod_name!r} has no {attr!r}. Fix: name a function defined in {mod_name} that {does} "
                       f"(MODULE:{kind}).") from None
    if not callable(obj):
        raise FitError(f"{spec} is a {type(obj).__name__}, not callable. Fix: name a function (or class) that "
                       f"{does}.")
    return obj


def parse_shape(shape: str | Sequence[int], name: str = "input shape", min_dims: int = 2) -> tuple[int, ...]:
    """``"8,1,512,512"`` or ``(8, 1, 512, 512)`` -> a tuple of positive ints, batch first."""
    try:
        if isinstance(shape, str):
            dims = tuple(int(s) for s in shape.split(","))
        else:
            dims = tuple(shape)
            if not all(isinstance(s, int) and not isinstance(s, bool) for s in dims):
                raise ValueError
    except (TypeError, ValueError):
        raise FitError(f"{name} {shape!r} is not a list of whole numbers. Fix: write it batch first, "
                       "e.g. 8,1,512,512 (batch, channels, height, width).") from None
    if len(dims) < min_dims or any(s < 1 for s in dims):
        raise FitError(f"{name} {dims}: needs at least {min_dims} sizes, each >= 1. Fix: write it batch first, "
                       "e.g. 8,1,512,512 (batch, channels, height, width) or 4,1,256 (batch, channels, length).")
    if math.prod(dims) > MAX_ELEMENTS:
        raise FitError(f"{name} {dims} holds {math.prod(dims):.3g} elements, more than any GPU holds. Fix: give "
                       f"one step's batch, at most {MAX_ELEMENTS:,} elements (1 PiB in fp32), e.g. 8,1,512,512.")
    return dims


def loss_function(loss: str | Callable) -> tuple[str, Callable]:
    """``loss`` (a name of ``LOSSES``, ``MODULE:FUNCTION`` or a callable) -> (its name, the function)."""
    if callable(loss):
        return getattr(loss, "__name__", "custom"), loss
    if ":" in loss:
        return loss, resolve_function(loss, "LOSS", "mypkg.losses:dice_loss", "takes (output, target)")
    if loss not in LOSSES:
        raise FitError(f"unknown loss {loss!r}: known are {', '.join(LOSSES)}. Fix: pick one of them, give "
                       "MODULE:FUNCTION of your own loss(output, target), or from Python pass a callable, "
                       "fit.fit(..., loss=my_loss, target_shape=..., n_classes=...).")
    return loss, LOSSES[loss]


def parse_techniques(techniques: Sequence[str] | str | None) -> list[str]:
    """``None`` (every technique), ``"ddp-2,inplace"`` or a list -> the techniques, each once."""
    if techniques is None:
        return list(TECHNIQUES)
    if isinstance(techniques, str):
        names = [t.strip() for t in techniques.split(",") if t.strip()]
        if techniques.strip() and not names:
            raise FitError(f"techniques {techniques!r} names no technique. Fix: leave --techniques out for all of "
                           f"them, give '' for the plain step alone, or name them, e.g. inplace,ddp-2.")
        techniques = names
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown:
        raise FitError(f"unknown technique(s) {', '.join(map(repr, unknown))}. Fix: pick from {', '.join(TECHNIQUES)}.")
    return list(dict.fromkeys(techniques))


def parse_capability(cc: tuple[int, int] | str | None) -> tuple[int, int] | None:
    """``(9, 0)``, ``"9.0"`` or None -> a (major, minor) pair; anything else a FitError."""
    if cc is None:
        return None
    try:
        major, minor = (int(v) for v in (cc.split(".") if isinstance(cc, str) else cc))
        if isinstance(cc, (tuple, list)) and any(isinstance(v, bool) for v in cc):
            raise ValueError
    except (TypeError, ValueError):
        raise FitError(f"compute capability {cc!r}: MAJOR.MINOR, e.g. 9.0 for an H100 or H200, 8.0 for an A100, "
                       "8.6 for an RTX 30xx. Fix: --compute-capability 9.0 (torch.cuda.get_device_capability() "
                       "on the card).") from None
    if not 3 <= major <= 20 or not 0 <= minor <= 9:
        raise FitError(f"compute capability {major}.{minor} is no CUDA card's. Fix: e.g. --compute-capability 9.0.")
    return major, minor


def underlying(exc: BaseException) -> BaseException:
    """What failed: the exception a ``MeasureError`` of ``predict_step`` wraps (its cause), else ``exc``."""
    if isinstance(exc, MeasureError) and not isinstance(exc, SavedTensorModifiedError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def explain_failure(exc: BaseException, what: str, input_shape: tuple[int, ...]) -> FitError:
    """A FitError that says why the model could not run on fake tensors, and what to do
    (``input_shape`` () while the model is built)."""
    from torch._subclasses import fake_tensor as ft

    exc = underlying(exc)
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if isinstance(exc, SavedTensorModifiedError) or "modified by an inplace operation" in str(exc):
        saved = getattr(exc, "saved", "")
        return FitError(f"{what}'s backward fails: an in-place operation overwrote a tensor saved for backward"
                        f"{f' ({saved})' if saved else ''} before backward read it. {_INPLACE_FIX}")
    data = (ft.DataDependentOutputException, ft.DynamicOutputShapeException)
    if isinstance(exc, data) or "data-dependent" in str(exc) or ".numpy()" in str(exc) \
            or "data_dependent" in type(exc).__name__.lower():
        return FitError(f"{what} reads tensor values, which fake tensors do not have ({text}). {_DATA_FIX}")
    if isinstance(exc, getattr(ft, "FakeTensorDeviceMismatchError", ())) or "cuda" in str(exc).lower():
        return FitError(f"{what} needs a real CUDA device ({text}); the prediction runs on fake CPU tensors "
                        f"with CUDA's rules. {_CUDA_FIX}")
    if not input_shape:  # while building: no input yet
        return FitError(f"{what} failed on fake tensors ({text}). Fix: check that the builder runs with no "
                        "arguments and returns the model (call it once yourself: build()).")
    return FitError(f"{what} failed on fake tensors of input shape {input_shape} ({text}). Fix: check that the "
                    "input shape is what the model expects (batch first, then channels and sizes), or measure "
                    "the step on a GPU with course_utils.memory.measure_step.")


def target_for(loss_name: str, loss_fn: Callable, out_shape: tuple[int, ...], target_shape: tuple[int, ...] | None,
               n_classes: int | None, custom: bool) -> tuple[tuple[int, ...], int | None]:
    """The target's shape and class count (None: float targets) for the loss and the output."""
    classify = n_classes is not None or (loss_name == "cross_entropy" and loss_fn is F.cross_entropy)
    if not out_shape and not custom:
        raise FitError(f"the loss {loss_name} needs an output with the batch first, and the model returns a tensor "
                       "of no dimensions (its loss already?). Fix: return one output per sample (batch, ...), or "
                       "--loss MODULE:FUNCTION with --target-shape for a loss of your own on that output.")
    if custom and not out_shape:  # a loss on the whole (non-tensor) output: the target is the user's to say
        if target_shape is None:
            raise FitError("a loss that takes the model's whole output needs the target's shape. Fix: "
                           "--target-shape B,... (and --classes N for class indices).")
        return tuple(target_shape), n_classes
    if classify:
        if len(out_shape) < 2:
            raise FitError(f"{loss_name} needs logits of shape (batch, classes, ...), the model returns "
                           f"{out_shape}. Fix: use --loss mse or bce for one output per sample, or give the "
                           "model a class dimension.")
        if n_classes is not None and n_classes != out_shape[1]:
            raise FitError(f"--classes {n_classes} but the model's output {out_shape} has {out_shape[1]} "
                           f"classes in dim 1. Fix: --classes {out_shape[1]} (or leave it out).")
        n_classes = out_shape[1]
        want = (out_shape[0], *out_shape[2:])
    else:
        want = out_shape
    tgt = tuple(target_shape) if target_shape is not None else want
    if tgt != want and not custom:
        kind = "class indices (the output without its class dim)" if classify else "the output's shape"
        raise FitError(f"target shape {tgt} does not match the model's output {out_shape} for {loss_name}: "
                       f"it needs {kind}, {want}. Fix: --target-shape {','.join(map(str, want))} (or leave "
                       "it out)" + ("" if classify else ", or use --loss cross_entropy for class labels") + ".")
    return tgt, (n_classes if classify else None)


def check_loss(loss_name: str, loss_fn: Callable, sel: Any, out_shape: tuple[int, ...], y: torch.Tensor,
               tgt: tuple[int, ...]) -> None:
    """The loss runs, forward and backward, on the output and the target (fake tensors)."""
    grad_in = torch.randn(out_shape, requires_grad=True) if out_shape else sel
    try:
        value = loss_fn(grad_in, y)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"it returned {type(value).__name__} {tuple(getattr(value, 'shape', ()))}, "
                            "not a one-element tensor")
        if value.requires_grad:
            value.backward()
    except Exception as e:
        raise FitError(f"the loss {loss_name} refuses the model's output {out_shape or type(sel).__name__} with a "
                       f"target {tgt} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Fix: pick the "
                       "loss that matches the output (--loss cross_entropy|mse|bce), pass --target-shape, or "
                       "--output to pick the tensor the loss takes.") from e


def _returned(obj: Any) -> tuple[str, str]:
    """What a builder returned that is not a model, in words, and the fix."""
    if obj is None:
        return "None", "end the builder with `return model`"
    if inspect.isclass(obj):
        return (f"the class {obj.__name__} (not an instance of it)", f"return an instance, `return {obj.__name__}(...)` "
                f"(or pass fit `lambda: {obj.__name__}(...)`)")
    if isinstance(obj, torch.Tensor):
        return f"a tensor of shape {tuple(obj.shape)}", "return the nn.Module, not its output or a weight"
    if callable(obj):
        name = getattr(obj, "__name__", type(obj).__name__)
        call = "call the function it made" if name.startswith("<") else f"`return {name}()`"
        return f"a function ({name})", f"return what that function builds ({call}), or pass fit the function itself"
    return f"a {type(obj).__name__} ({obj!r:.40})", "return the model (e.g. `def build(): return MyNet(...)`)"


# --------------------------------------------------------------------------------------------
# The model, built inside FakeTensorMode, and what the techniques change in it
# --------------------------------------------------------------------------------------------
def build_model(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` checked: an nn.Module, its fake tensors all of the active fake mode."""
    try:
        with warnings.catch_warnings():  # copy.deepcopy of fake parameters (nn.TransformerEncoder) warns
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            model = build_fake(build)
    except FitError:
        raise
    except MeasureError as e:  # a .to() inside the builder
        raise FitError(e.problem.replace("the builder converts", "building the model converts"), e.fix) from None
    except TypeError as e:
        if inspect.isclass(build) and "argument" in str(e):  # fit(MyNet): MyNet() without its arguments
            raise FitError(f"the builder is the class {build.__name__}, and {build.__name__}() fails ({e}). Fix: "
                           f"pass a function that builds it with its arguments, `lambda: {build.__name__}(...)`."
                           ) from None
        raise explain_failure(e, "building the model", ()) from e
    except Exception as e:
        raise explain_failure(e, "building the model", ()) from e
    if not isinstance(model, nn.Module):
        what, fix = _returned(model)
        raise FitError(f"the builder returned {what}, not an nn.Module. Fix: {fix}.")
    if type(model).forward is nn.Module.forward:  # nn.Module() itself, or a subclass without forward
        raise FitError(f"the builder returned a {type(model).__name__} without a forward method. Fix: define "
                       f"forward(self, x) in {type(model).__name__}, or return the network that has one.")
    try:
        adopt_fake_tensors(model)
    except MeasureError as e:  # a model built before, outside the fake mode
        raise FitError(str(e)) from None
    return model


def check_trainable(model: nn.Module, loop: Loop) -> None:
    """A step that trains needs parameters that learn; an optimizer needs parameters at all."""
    params = list(model.parameters())
    name = type(model).__name__
    if not params and loop.mode != "inference" and loop.optimizer_name != "none":
        raise FitError(f"the builder returned a model with no parameters ({name}), so the optimizer ({loop.optimizer_name}) "
                       "has nothing to hold. Fix: check that the builder returns the model with its layers (not "
                       "an activation or a container left empty), or --optimizer none, or --mode inference.")
    if loop.mode == "train" and not any(p.requires_grad for p in params):
        raise FitError(f"no parameter of the {name} the builder returned requires grad (none, or all frozen): a "
                       "training step has nothing to learn and its backward fails. Fix: --mode forward or --mode "
                       "inference, or unfreeze what you train (p.requires_grad_(True)).")


def _repeated(module: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The elements of ``module`` if it is (or holds) a Sequential/ModuleList of composite modules."""
    def composite(seq: nn.Module) -> list[tuple[str, nn.Module]] | None:
        items = list(seq.named_children())
        if isinstance(seq, (nn.Sequential, nn.ModuleList)) and items and \
                all(list(m.children()) for _, m in items):
            return items
        return None

    if (items := composite(module)) is not None:
        return items
    for name, child in module.named_children():
        if (items := composite(child)) is not None and len(items) >= 2:
            return [(f"{name}.{n}", m) for n, m in items]
    return None


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's blocks (module path, module), in registration order: each top-level child
    that has children of its own; a child that is, or holds, a Sequential/ModuleList of such
    composite modules stands for its elements (ResNet's ``layer1.0``, ``layer1.1``;
    ``encoder.layers.0`` ...). Single layers are not blocks."""
    out = []
    for name, child in model.named_children():
        items = _repeated(child)
        if items is not None:
            out += [(f"{name}.{n}", m) for n, m in items]
        elif list(child.children()):
            out.append((name, child))
    return out


def activation_modules(model: nn.Module) -> list[nn.Module]:
    """Activation modules with an ``inplace`` switch (torch.nn.modules.activation)."""
    return [m for m in model.modules()
            if type(m).__module__ == "torch.nn.modules.activation" and isinstance(getattr(m, "inplace", None), bool)]


#: selective checkpointing keeps these outputs (beside convolutions): matrix products and attention
_MATMUL_NAMES = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention")
_MATMUL_OPS = {getattr(torch.ops.aten, n).default for n in _MATMUL_NAMES if hasattr(torch.ops.aten, n)}


def save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any):
    """Selective-checkpointing policy: ``checkpointing.save_convolutions`` extended to matrix
    products (``mm``, ``addmm``, ``bmm``, ``baddbmm``: linear layers, attention projections)
    and fused attention: store their outputs, recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy

    if op in _MATMUL_OPS:
        return CheckpointPolicy.MUST_SAVE
    return save_convolutions(ctx, op, *args, **kwargs)


def _checkpoint_forward(block: nn.Module, policy: Callable | None) -> None:
    """``block``'s forward runs under ``checkpointing.checkpointed`` (its BatchNorms frozen in
    the recomputation) whenever gradients are on; keyword arguments are passed through."""
    forward = block.forward

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpointed(functools.partial(forward, **kwargs), *args, policy=policy, bn_scope=block)

    block.forward = checkpointed_forward


def _offload_forward(model: nn.Module) -> None:
    forward = model.forward

    def offloaded_forward(*args: Any, **kwargs: Any) -> Any:
        with offload_saved(args[0]):
            return forward(*args, **kwargs)

    model.forward = offloaded_forward


def variant(build: Callable[[], nn.Module], technique: str) -> Callable[[], nn.Module]:
    """A builder of ``build()``'s model with ``technique`` applied to it (the model-changing
    ones: ``inplace``, ``checkpoint-blocks``, ``selective``, ``offload``; others return it as is)."""
    def built() -> nn.Module:
        model = build_model(build)
        if technique == "inplace":
            for m in activation_modules(model):
                m.inplace = True
        elif technique in ("checkpoint-blocks", "selective"):
            for _, block in blocks(model):
                _checkpoint_forward(block, save_matmuls if technique == "selective" else None)
        elif technique == "offload":
            _offload_forward(model)
        return model

    return built


guard(globals(), FitError)

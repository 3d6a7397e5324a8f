"""The learner's network as ``fit`` sees it: named, checked, built on fake tensors, changed by a technique.

* ``resolve_builder`` / ``resolve_function`` / ``parse_shape`` -- the CLI's and ``fit``'s inputs
  checked (``MODULE:BUILDER``, ``MODULE:LOSS``, ``8,1,512,512``); ``FitError`` names the fix for
  anything ``fit`` cannot predict.
* ``build_model`` -- ``build()`` inside the active ``FakeTensorMode``, checked (an ``nn.Module``, its
  tensors of the active mode); ``explain_failure`` says why a model cannot run on fake tensors
  (it reads tensor values, or needs a real CUDA device) and what to do.
* ``blocks`` -- the model's blocks (checkpointing's and FSDP's units), found from its structure.
* ``variant`` -- a builder of the model with a technique applied: ``inplace`` activations,
  ``checkpoint-blocks``, ``selective`` (``save_matmuls``), ``offload``.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .checks import FitError, guard
from .checkpointing import checkpointed, offload_saved, save_convolutions
from .memory import adopt_fake_tensors

_DATA_FIX = ("Fix: remove data-dependent branches from forward (no .item(), .tolist(), .numpy(), no Python "
             "`if` on a tensor's value, no nonzero/boolean-mask indexing: use torch.where and fixed shapes), "
             "or measure the step on a GPU with course_utils.memory.measure_step.")
_CUDA_FIX = ("Fix: make tensors on the input's device (device=x.device, or register them as buffers) instead "
             "of 'cuda', and call no torch.cuda API in __init__ or forward; or measure the step on a GPU with "
             "course_utils.memory.measure_step.")


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
    return dims


def explain_failure(exc: BaseException, what: str, input_shape: tuple[int, ...]) -> FitError:
    """A FitError that says why the model could not run on fake tensors, and what to do."""
    from torch._subclasses import fake_tensor as ft

    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    data = (ft.DataDependentOutputException, ft.DynamicOutputShapeException)
    if isinstance(exc, data) or "data-dependent" in str(exc) or ".numpy()" in str(exc) \
            or "data_dependent" in type(exc).__name__.lower():
        return FitError(f"{what} reads tensor values, which fake tensors do not have ({text}). {_DATA_FIX}")
    if isinstance(exc, getattr(ft, "FakeTensorDeviceMismatchError", ())) or "cuda" in str(exc).lower():
        return FitError(f"{what} needs a real CUDA device ({text}); the prediction runs on fake CPU tensors "
                        f"with CUDA's rules. {_CUDA_FIX}")
    return FitError(f"{what} failed on fake tensors of input shape {input_shape} ({text}). Fix: check that the "
                    "input shape is what the model expects (batch first, then channels and sizes), or measure "
                    "the step on a GPU with course_utils.memory.measure_step.")


# --------------------------------------------------------------------------------------------
# The model, built inside FakeTensorMode, and what the techniques change in it
# --------------------------------------------------------------------------------------------
def build_model(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` checked: an nn.Module, its fake tensors all of the active fake mode."""
    try:
        with warnings.catch_warnings():  # copy.deepcopy of fake parameters (nn.TransformerEncoder) warns
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            model = build()
    except FitError:
        raise
    except Exception as e:
        raise explain_failure(e, "building the model", ()) from e
    if not isinstance(model, nn.Module):
        raise FitError(f"the builder returned a {type(model).__name__}, not an nn.Module. Fix: make it return "
                       "the model (e.g. `def build(): return MyNet(...)`).")
    adopt_fake_tensors(model)
    return model


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

"""The training loops people run, as data: ``Loop`` says which optimizer, how gradients are
cleared, whether they accumulate over micro-batches or are applied inside backward, and whether
the step trains at all (``mode``). Each choice changes what a GPU holds:

==========================  ==========================================================================
choice                      what it changes (per step, steady state)
==========================  ==========================================================================
``optimizer``               state per parameter: Adam/AdamW two moments, SGD with momentum one
                            buffer, SGD without momentum or ``"none"`` nothing
``foreach`` / ``fused``     the optimizer step's temporaries: foreach (CUDA's default) works on whole
                            lists of tensors at once; fused runs one kernel with none
``keep_grads``              ``zero_grad(set_to_none=False)``: the gradients stay allocated through the
                            next forward, and backward adds into them (loops written for torch < 2.0)
``accumulate=K``            K micro-batches per optimizer step: from the second on, the gradients
                            exist while the forward's activations do
``optimizer_in_backward``   one optimizer per parameter, stepped by its post-accumulate-grad hook and
                            the gradient freed at once (PyTorch's tutorial "How to save memory by
                            fusing the optimizer step into the backward pass"; the tutorial builds
                            them with ``foreach=False``, CUDA's default is foreach)
``mode``                    ``"train"``: the step; ``"forward"``: a train-mode forward and the loss,
                            no backward (what "allocated after the forward" measures);
                            ``"inference"``: ``model.eval()`` under ``torch.inference_mode``
``output``                  which part of a tuple / dict / ``ModelOutput``-like output the loss takes
==========================  ==========================================================================

``Loop.run`` is ``train.training_step`` with these choices applied (the forward modes run the
same forward and loss, without backward); ``Loop.make_optimizer`` and ``Loop.prime`` build the
optimizer and put it (and kept gradients) in the state a running loop has from step 2 on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .checks import LoopError, guard
from .train import require_data, step_autocast, training_step

OPTIMIZERS = ("adam", "adamw", "sgd", "none")
MODES = ("train", "forward", "inference")
#: SGD's momentum when none is given: the value of the published recipes (ResNet, torchvision's
#: reference scripts); ``torch.optim.SGD``'s own default is 0 (no momentum buffer at all)
SGD_MOMENTUM = 0.9


def select_output(out: Any, output: int | str | None) -> Any:
    """The part of a model's output the loss takes: ``out`` itself (``output`` None), an element
    of a tuple or list, or a dict's value in order (an int), a key of a dict, a named tuple's
    field or an attribute (a str: e.g. a Hugging Face ``ModelOutput``'s ``"logits"``)."""
    if output is None:
        return out
    if isinstance(output, bool) or not isinstance(output, (int, str)):
        raise LoopError(f"output={output!r} is neither an index nor a key.",
                        "give an index (int, e.g. output=0) or a key / attribute name (str, e.g. output='logits').")
    if isinstance(out, torch.Tensor):
        raise LoopError(f"output={output!r}, but the model returns one tensor, which is what the loss takes. "
                        "Fix: leave output out.")
    if isinstance(output, int):
        if isinstance(out, Mapping):  # a ModelOutput indexes its values in order, as its to_tuple()
            out = tuple(out.values())
        if not isinstance(out, (tuple, list)):
            raise LoopError(f"output={output} picks an element of a tuple, but the model returns a "
                            f"{type(out).__name__}. Fix: leave output out, or name a key (output='logits').")
        if not -len(out) <= output < len(out):
            raise LoopError(f"output={output}, but the model returns {len(out)} outputs. "
                            f"Fix: an index from 0 to {len(out) - 1}.")
        return out[output]
    if isinstance(out, Mapping):
        if output not in out:
            raise LoopError(f"output={output!r} is not a key of the model's output; its keys are "
                            f"{', '.join(map(repr, out))}. Fix: one of those.")
        return out[output]
    if isinstance(out, (tuple, list)):  # a named tuple's fields, never a tuple's methods (count, index)
        fields = getattr(type(out), "_fields", ())
        if output in fields:
            return getattr(out, output)
        raise LoopError(f"output={output!r}: the model returns a {type(out).__name__} of {len(out)} outputs"
                        + (f" with the fields {', '.join(fields)}" if fields else "")
                        + ". Fix: an index (output=0)" + (" or one of the fields." if fields else "."))
    if hasattr(out, output):
        return getattr(out, output)
    raise LoopError(f"output={output!r}: the model returns a {type(out).__name__}, which has no key or attribute "
                    f"{output!r}. Fix: an index for a tuple (output=0), or the name of a dict key.")


class OptimizerInBackward:
    """One optimizer per parameter, stepped inside backward by the parameter's
    ``register_post_accumulate_grad_hook``, which then frees (or zeroes) the gradient: no
    gradient outlives its own accumulation. ``step()`` steps every optimizer (a first step's
    state, ``Loop.prime``); ``training_step`` recognises ``in_backward`` and calls neither
    ``zero_grad`` nor ``step``. ``remove()`` takes the hooks off."""

    in_backward = True

    def __init__(self, params: Iterable[nn.Parameter], factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 set_to_none: bool = True):
        self.set_to_none = set_to_none
        self.optimizers = {p: factory([p]) for p in params if p.requires_grad}
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.optimizers]

    def _hook(self, p: nn.Parameter) -> None:
        opt = self.optimizers[p]
        opt.step()
        opt.zero_grad(set_to_none=self.set_to_none)

    def step(self) -> None:
        """Step every parameter's optimizer (outside backward: to create the state)."""
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every gradient, as ``Optimizer.zero_grad``."""
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def optimizers_of(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers behind ``optimizer`` (one, none, or one per parameter)."""
    if optimizer is None:
        return []
    if isinstance(optimizer, OptimizerInBackward):
        return list(optimizer.optimizers.values())
    return [optimizer]


def prime_optimizer(model: nn.Module, optimizer: Any) -> None:
    """Put ``optimizer`` in the state it has after a first step (Adam's two moments, SGD's
    momentum buffers...) without a forward pass: one ``step()`` on zero gradients, then the
    gradients are dropped, as ``zero_grad(set_to_none=True)`` does at the next step."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Loop:
    """A training loop's memory-relevant choices (see the module's table); checked when made."""

    optimizer: str | None = None  # OPTIMIZERS; None: "adam" to train, "none" for inference
    momentum: float | None = None  # SGD only; None: SGD_MOMENTUM
    foreach: bool | None = None  # None: the target's default (CUDA: foreach)
    fused: bool = False
    keep_grads: bool = False
    accumulate: int = 1
    optimizer_in_backward: bool = False
    mode: str = "train"
    output: int | str | None = None

    def __post_init__(self) -> None:
        for problem in self._problems():
            raise LoopError(problem)

    def _problems(self) -> Iterable[str]:
        yield from self._type_problems()
        opt = self.optimizer_name
        if self.mode == "inference" and self.optimizer not in (None, "none"):
            yield (f"mode 'inference' trains nothing, so optimizer {self.optimizer!r} has no memory to add. "
                   "Fix: leave the optimizer out (or use mode 'forward' for a training loop's forward)")
        if self.mode == "inference" and self.keep_grads:
            yield "mode 'inference' has no gradients to keep. Fix: leave keep_grads out, or use mode 'forward'"
        if self.mode != "train" and self.accumulate > 1:
            yield f"accumulate={self.accumulate} needs backward passes. Fix: mode 'train'"
        if self.mode != "train" and self.optimizer_in_backward:
            yield "optimizer_in_backward needs a backward pass. Fix: mode 'train'"
        if self.momentum is not None:
            if opt != "sgd":
                yield f"momentum={self.momentum} is SGD's. Fix: optimizer 'sgd', or leave momentum out"
            elif not (self.momentum >= 0):
                yield f"momentum={self.momentum}: must be >= 0. Fix: e.g. momentum=0.9 (0: plain SGD, no momentum buffer)"
        if self.fused and self.foreach:
            yield "fused and foreach are two implementations of one step. Fix: pick one"
        if (self.fused or self.foreach is not None) and opt == "none":
            yield "fused / foreach choose how an optimizer steps, and there is none. Fix: name an optimizer"
        if self.optimizer_in_backward and opt == "none":
            yield "optimizer_in_backward steps an optimizer inside backward. Fix: name one (e.g. 'adamw')"
        if self.optimizer_in_backward and self.accumulate > 1:
            yield ("optimizer_in_backward steps at every backward, so gradients cannot accumulate over "
                   "micro-batches (PyTorch's tutorial says so). Fix: drop one of the two")

    def _type_problems(self) -> Iterable[str]:
        """Each option of the right kind: a string "false" or a 1 where a bool is meant would
        otherwise count as True, silently."""
        if self.mode not in MODES:
            yield f"mode {self.mode!r}: one of {', '.join(MODES)} (lower case). Fix: e.g. mode 'train'"
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            yield f"optimizer {self.optimizer!r}: one of {', '.join(OPTIMIZERS)}. Fix: e.g. optimizer 'adamw'"
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int) or self.accumulate < 1:
            yield (f"accumulate={self.accumulate!r}: a whole number of micro-batches per step, >= 1. "
                   "Fix: e.g. accumulate=4")
        for name in ("fused", "keep_grads", "optimizer_in_backward"):
            if not isinstance(getattr(self, name), bool):
                yield f"{name}={getattr(self, name)!r}: True or False. Fix: {name}=True (or leave it out)"
        if self.foreach is not None and not isinstance(self.foreach, bool):
            yield f"foreach={self.foreach!r}: True, False or None (the target's default). Fix: foreach=False"
        m = self.momentum
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m)):
            yield f"momentum={m!r}: a finite number >= 0. Fix: e.g. momentum=0.9"
        if self.output is not None and (isinstance(self.output, bool) or not isinstance(self.output, (int, str))):
            yield f"output={self.output!r}: an index (int) or a key / attribute name (str). Fix: e.g. output='logits'"

    @property
    def optimizer_name(self) -> str:
        """The optimizer the loop runs: the given one, else "adam" to train and "none" for inference."""
        return self.optimizer or ("none" if self.mode == "inference" else "adam")

    @property
    def sgd_momentum(self) -> float:
        """SGD's momentum: the given one, else ``SGD_MOMENTUM``."""
        return SGD_MOMENTUM if self.momentum is None else float(self.momentum)

    def state_per_parameter(self) -> int:
        """Values of optimizer state each parameter keeps: 2 (Adam, AdamW), 1 (SGD with momentum), 0."""
        opt = self.optimizer_name
        return {"adam": 2, "adamw": 2, "sgd": 1 if self.sgd_momentum else 0}.get(opt, 0)

    def _factory(self, foreach: bool) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None:
        opt = self.optimizer_name
        impl: dict[str, Any] = {"fused": True} if self.fused else {"foreach": foreach}
        if opt in ("adam", "adamw"):
            cls = torch.optim.Adam if opt == "adam" else torch.optim.AdamW
            return lambda ps: cls(ps, lr=1e-3, **impl)
        if opt == "sgd":
            return lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=self.sgd_momentum, **impl)
        return None

    def make_optimizer(self, model: nn.Module, default_foreach: bool = True) -> Any:
        """The loop's optimizer for ``model`` (None for "none"; an ``OptimizerInBackward`` for
        ``optimizer_in_backward``); ``foreach`` None takes ``default_foreach`` (CUDA: True)."""
        factory = self._factory(default_foreach if self.foreach is None else self.foreach)
        if factory is None or self.mode == "inference":
            return None
        if self.optimizer_in_backward:
            return OptimizerInBackward(model.parameters(), factory, set_to_none=not self.keep_grads)
        return factory(list(model.parameters()))

    def prime(self, model: nn.Module, optimizer: Any) -> None:
        """The state of a running loop before its next step: the optimizer's state exists, and with
        ``keep_grads`` so do the gradients (zeroed, not freed)."""
        if optimizer is not None:
            prime_optimizer(model, optimizer)
        if self.keep_grads and self.mode != "inference":
            with torch.no_grad():
                for p in model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)

    def describe(self) -> str:
        """The loop in words, e.g. "train: SGD (momentum 0.9, foreach), zero_grad(set_to_none=True)"."""
        if self.mode == "inference":
            return "inference: model.eval() under torch.inference_mode(), forward only"
        opt = self.optimizer_name
        if opt == "none":
            what = "no optimizer (loss.backward() alone; model.zero_grad)"
        else:
            name = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}[opt]
            impl = "fused" if self.fused else ("foreach" if self.foreach in (None, True) else "for-loop")
            mom = f"momentum {self.sgd_momentum:g}, " if opt == "sgd" else ""
            what = f"{name} ({mom}{impl})" + (", stepped per parameter inside backward" if self.optimizer_in_backward
                                               else "")
        grads = f"zero_grad(set_to_none={not self.keep_grads})"
        acc = f", {self.accumulate} micro-batches per step" if self.accumulate > 1 else ""
        out = f", loss on output {self.output!r}" if self.output is not None else ""
        head = "forward: a train-mode forward and the loss, no backward" if self.mode == "forward" else "train"
        return f"{head}: {what}, {grads}{acc}{out}"

    def run(self, model: nn.Module, x: torch.Tensor, target: torch.Tensor, optimizer: Any, *,
            loss_fn: Callable, autocast_dtype: torch.dtype | None = None, micro_batches: int | None = None) -> Any:
        """One step of this loop on ``(x, target)``; ``micro_batches`` caps how many of the
        ``accumulate`` micro-batches run (the second and later ones hold the same memory: a
        prediction runs two). Returns the loss (train) or the output (forward, inference)."""
        require_data(model, x, where="Loop.run")
        if self.mode == "inference":
            was_training = model.training
            model.eval()
            try:
                with torch.inference_mode(), step_autocast(x, autocast_dtype):
                    return select_output(model(x), self.output)
            finally:
                model.train(was_training)
        if optimizer is None:
            model.zero_grad(set_to_none=not self.keep_grads)
        if self.mode == "forward":
            with step_autocast(x, autocast_dtype):
                return loss_fn(select_output(model(x), self.output), target)
        k = self.accumulate if micro_batches is None else max(1, min(self.accumulate, micro_batches))
        return training_step(model, x, target, optimizer, loss_fn=loss_fn, autocast_dtype=autocast_dtype,
                             set_to_none=not self.keep_grads, accumulate=k,
                             output=None if self.output is None else lambda out: select_output(out, self.output))


guard(globals(), LoopError, signed=("output",))  # output: an index may count from the end (-1)

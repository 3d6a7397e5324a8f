"""CUDA's autocast rules, applied on a CPU: predict a GPU's mixed-precision memory without a GPU.

``torch.autocast`` decides op by op which dtype to run in, and the lists differ by device. On
the CPU, ``max_pool3d``, ``cat`` and ``cross_entropy_loss`` are on autocast's float32 list; on
CUDA they are not. ``max_pool3d`` and ``cat`` then run in the dtype of their inputs;
``cross_entropy_loss`` runs as the ops it is made of, each through CUDA autocast on its own:
``log_softmax`` is called with ``dtype=`` its input's dtype, so its fp32 rule (which applies only
when no dtype is given) does not fire and ``_log_softmax`` runs in fp16 (bf16); ``nll_loss`` is on
the fp32 list and casts the log-probabilities to fp32. ``F.log_softmax(x)`` called directly does
run in fp32. ``aten_dtypes`` shows this through the real kernels. A prediction made on a CPU
with CPU autocast would therefore describe a CPU, not the GPU the learner trains on.

How this module makes CPU autocast follow CUDA's rules, using the dispatcher itself:

* ``torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")`` lists the ops that
  have a CUDA autocast kernel *in the installed torch*; every other op falls through, i.e. runs
  in its inputs' dtype. (A documentation page can lag the code; the dispatcher cannot.)
* Which cast a registered op gets (lower precision, float32, float32 via a ``dtype=`` argument,
  promote to the widest input) is not visible from Python; it comes from the lists in
  ``aten/src/ATen/autocast_mode.h`` (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
  ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``, ...), copied below. An op the
  installed torch registers for CUDA but that these lists do not know is reported by
  ``unknown_cuda_ops()`` (a test keeps that set empty, so a torch upgrade that adds one fails
  loudly instead of silently predicting wrong dtypes).
* ``cuda_autocast_rules()`` registers, for as long as it is active, Python kernels on the
  ``AutocastCPU`` dispatch key (``torch.library``) that implement exactly the CUDA policy, and
  a fall-through for ops that only the CPU casts. The real ``torch.autocast("cpu", dtype)`` then
  behaves as ``torch.autocast("cuda", dtype)`` would: casts happen above autograd, so the graph
  saves the same dtypes, and checkpoint recomputation (which re-enters autocast) follows the
  same rules. On exit the registrations are removed and CPU autocast is itself again.

As on CUDA, fp32 leaf tensors that require grad (the weights) are cast once per autocast region
and the copies cached until the outermost ``torch.autocast`` exits.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Iterator

import torch

from .checks import SetupError, guard

#: ``AT_FORALL_LOWER_PRECISION_FP`` (+ cuDNN's convolutions, registered separately for CUDA):
#: inputs cast to the autocast dtype (float16 or bfloat16).
LOWER_PRECISION = frozenset({
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
})
#: ``AT_FORALL_FP32`` (+ ``rms_norm``): inputs cast to float32.
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "rms_norm",
    # torch 2.15 registers it apart from the header's lists; fp32 (its real kernel, run on fake
    # CUDA tensors, returns float32 for float16 and bfloat16 inputs)
    "linalg_matrix_sqrth",
})
#: ``AT_FORALL_FP32_SET_OPT_DTYPE``: run with ``dtype=torch.float32`` unless a dtype was given
#: (the output is float32; the input is not copied to float32 first).
FP32_SET_OPT_DTYPE = frozenset({
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname",
    "log_softmax.int", "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum",
    "cumsum.dimname", "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "sum", "sum.dim_IntList", "sum.dim_DimnameList",
})
#: ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``: ``norm`` redispatched with ``dtype=float32``.
FP32_APPEND_DTYPE = frozenset({"norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim"})
#: ``AT_FORALL_PROMOTE`` (+ ``grid_sampler``): inputs cast to the widest floating input type.
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
})
#: refused under CUDA autocast (unsafe in fp16): ``binary_cross_entropy``.
BANNED = frozenset({"binary_cross_entropy"})
#: CUDA builds only, registered apart (``aten/src/ATen/cudnn/AutocastRNN.cpp``): cuDNN's RNN casts
#: its input, states and weights to float16 whatever the autocast dtype. A CPU never reaches it
#: (its RNNs do not run through cuDNN), so the emulation does not model RNNs; the course has none.
HALF_ALWAYS = frozenset({"_cudnn_rnn"})

POLICIES = {
    "lower_precision_fp": LOWER_PRECISION, "fp32": FP32, "fp32_set_opt_dtype": FP32_SET_OPT_DTYPE,
    "fp32_append_dtype": FP32_APPEND_DTYPE, "promote": PROMOTE, "banned": BANNED, "fp16": HALF_ALWAYS,
}
SOURCE = ("CUDA autocast lists of PyTorch's aten/src/ATen/autocast_mode.h, restricted to the ops "
          "the installed torch registers for the AutocastCUDA dispatch key")


def _strip(name: str) -> str:
    return name[len("aten::"):] if name.startswith("aten::") else name


def registered(key: str) -> frozenset[str]:
    """Ops (``name`` or ``name.overload``) with a kernel for dispatch key ``key`` in this torch,
    e.g. ``registered("AutocastCUDA")``."""
    return frozenset(_strip(n) for n in torch._C._dispatch_get_registrations_for_dispatch_key(key))


def cuda_policy(op: str) -> str | None:
    """The CUDA autocast policy of ``op`` (``"conv3d"``, ``"sum.dim_IntList"``, ...) in the
    installed torch, or None when CUDA autocast leaves it alone (it runs in its inputs' dtype)."""
    op = _strip(op)
    return _policy_of(op) if op in registered("AutocastCUDA") else None


def _policy_of(op: str) -> str:
    """The list of autocast_mode.h that names ``op`` (a registered CUDA autocast op)."""
    return next((policy for policy, ops in POLICIES.items() if op in ops), "unknown")


def unknown_cuda_ops() -> frozenset[str]:
    """Ops this torch registers for CUDA autocast whose policy the lists above do not give."""
    known = frozenset().union(*POLICIES.values())
    return frozenset(op for op in registered("AutocastCUDA") if op not in known)


def cpu_only_ops() -> frozenset[str]:
    """Ops CPU autocast casts and CUDA autocast leaves alone (max_pool3d, cat, ...)."""
    return registered("AutocastCPU") - registered("AutocastCUDA")


# --------------------------------------------------------------------------------------------
# The Python kernels
# --------------------------------------------------------------------------------------------
_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(t: Any, dtype: torch.dtype) -> Any:
    """Like ATen's ``cached_cast``: cast an eligible tensor; cache casts of fp32 leaf weights."""
    if isinstance(t, (list, tuple)):
        return type(t)(_cast(v, dtype) for v in t)
    if not _eligible(t) or t.dtype == dtype:
        return t
    cacheable = (dtype == torch.get_autocast_dtype("cpu") and t.dtype == torch.float32
                 and t.requires_grad and t.is_leaf and not t._is_view()
                 and torch.is_autocast_cache_enabled())
    if cacheable:
        hit = _cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
    out = t.to(dtype)
    if cacheable:
        _cache[id(t)] = (weakref.ref(t), out)
    return out


def _widest(args: tuple, kwargs: dict) -> torch.dtype | None:
    widest = None
    for a in [*args, *kwargs.values()]:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if _eligible(t):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
    return widest


def _first_tensor(args: tuple) -> Any:
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor):
                return t
    return None


def _kernel(op: torch._ops.OpOverload, policy: str):
    schema_args = [a.name for a in op._schema.arguments]

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if policy == "lower_precision_fp":
                dt = torch.get_autocast_dtype("cpu")
                return op(*_cast(args, dt), **{k: _cast(v, dt) for k, v in kwargs.items()})
            if policy in ("fp32", "fp16"):
                dt = torch.float32 if policy == "fp32" else torch.float16
                return op(*_cast(args, dt), **{k: _cast(v, dt) for k, v in kwargs.items()})
            if policy == "promote":
                dt = _widest(args, kwargs)
                if dt is None:
                    return op(*args, **kwargs)
                return op(*_cast(args, dt), **{k: _cast(v, dt) for k, v in kwargs.items()})
            if policy == "fp32_set_opt_dtype":
                i = schema_args.index("dtype")
                given = kwargs.get("dtype", args[i] if i < len(args) else None)
                if given is None and _eligible(_first_tensor(args)):
                    if i < len(args):
                        args = (*args[:i], torch.float32, *args[i + 1:])
                    else:
                        kwargs = dict(kwargs, dtype=torch.float32)
                return op(*args, **kwargs)
            if policy == "fp32_append_dtype":
                target = {"Scalar": torch.ops.aten.norm.ScalarOpt_dtype,
                          "ScalarOpt_dim": torch.ops.aten.norm.ScalarOpt_dim_dtype,
                          "names_ScalarOpt_dim": torch.ops.aten.norm.names_ScalarOpt_dim_dtype}
                redo = target[op._overloadname]
                if not _eligible(args[0]):
                    return op(*args, **kwargs)
                if op._overloadname == "Scalar":
                    return redo(args[0], args[1] if len(args) > 1 else 2, dtype=torch.float32)
                return redo(*args, dtype=torch.float32, **kwargs)
            if policy == "banned":
                raise RuntimeError(
                    f"torch.nn.functional.{op._opname} is unsafe to autocast (CUDA refuses it). "
                    "Fix: use binary_cross_entropy_with_logits (BCEWithLogitsLoss)."
                )
            raise AssertionError(policy)

    return run


def _overload(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


_clear_autocast_cache = torch.clear_autocast_cache


def _clear_both() -> None:
    _cache.clear()
    _clear_autocast_cache()


@contextlib.contextmanager
def cuda_autocast_rules() -> Iterator[dict[str, str]]:
    """While active, ``torch.autocast("cpu", dtype)`` applies CUDA's autocast rules (see the
    module docstring). Yields the policy of every op it changed. Not reentrant."""
    unknown = unknown_cuda_ops()
    if unknown:
        raise RuntimeError(
            f"torch {torch.__version__} registers CUDA autocast kernels for {sorted(unknown)} whose "
            "policy course_utils.amp_rules does not know: add them to the lists in amp_rules.py "
            "from aten/src/ATen/autocast_mode.h of this torch version."
        )
    cuda, cpu = registered("AutocastCUDA"), registered("AutocastCPU")
    lib = torch.library.Library("aten", "IMPL")
    changed: dict[str, str] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for name in sorted(cuda | cpu):
                if name in cuda:
                    policy = _policy_of(name)  # name is in cuda: cuda_policy without the rebuild
                    lib.impl(name, _kernel(_overload(name), policy), "AutocastCPU")
                else:
                    policy = "fallthrough"
                    lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
                changed[name] = policy
        # torch.autocast.__exit__ clears the weight-cast cache through torch.clear_autocast_cache
        torch.clear_autocast_cache = _clear_both
        yield changed
    finally:
        torch.clear_autocast_cache = _clear_autocast_cache
        _cache.clear()
        lib._destroy()


def autocast_rules(device: str | None) -> contextlib.AbstractContextManager:
    """The context that makes CPU autocast follow ``device``'s rules: CUDA's for ``"cuda"``,
    the CPU's own for ``"cpu"`` or None."""
    if device is None or device == "cpu":
        return contextlib.nullcontext({})
    if device == "cuda":
        return cuda_autocast_rules()
    raise ValueError(f"autocast rules for {device!r}: use 'cuda' or 'cpu'")


# --------------------------------------------------------------------------------------------
# Checking the emulation against the real AutocastCUDA kernels, without a GPU
# --------------------------------------------------------------------------------------------
def _fake_cuda_copy(module: torch.nn.Module) -> torch.nn.Module:
    """Replace every parameter and buffer of ``module`` by a fake CUDA tensor of the same shape
    and dtype (inside a ``FakeTensorMode``; ``module.to("cuda")`` needs a CUDA build). The
    parameters do not require grad: autograd on fake CUDA tensors needs a CUDA device guard."""
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cuda"), False))
        for name, b in list(mod.named_buffers(recurse=False)):
            if b is not None:
                mod.register_buffer(name, torch.empty(b.shape, dtype=b.dtype, device="cuda"))
    return module


@contextlib.contextmanager
def _traced_autocast(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Autocast ``dtype`` for the tracers below: on ``"cuda"`` the real AutocastCUDA kernels,
    switched on by hand (``torch.autocast("cuda")`` switches itself off when CUDA is
    unavailable) and restored after; on ``"cpu"`` CPU autocast under ``cuda_autocast_rules()``."""
    if device != "cuda":
        with cuda_autocast_rules(), torch.autocast("cpu", dtype=dtype):
            yield
        return
    was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", was[0])
        torch.set_autocast_dtype("cuda", was[1])
        torch.clear_autocast_cache()


def trace_dtypes(build, input_shape, target_shape, loss_fn, device: str = "cuda",
                 dtype: torch.dtype = torch.float16, train: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """Every torch function the forward pass and the loss of ``build()`` call under autocast
    ``dtype``, with the dtypes of what each returned, in order; on fake tensors (no memory, no
    GPU). ``device="cuda"``: fake CUDA tensors, dispatched through the installed torch's real
    ``AutocastCUDA`` C++ kernels. ``device="cpu"``: fake CPU tensors under
    ``cuda_autocast_rules()`` -- the emulation the predictor uses. The two lists must agree.

    Runs without autograd and with the model in eval mode: on a CPU build, autograd and
    training-mode BatchNorm need a CUDA device guard on fake CUDA tensors. BatchNorm is on no
    autocast list, and eval mode keeps its output dtype (the input's) as training mode does;
    ``train=True`` (CPU only) lets a test check that."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.log: list[tuple[str, tuple[str, ...]]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            dtypes = tuple(str(o.dtype).removeprefix("torch.") for o in outs if isinstance(o, torch.Tensor))
            if dtypes and getattr(func, "__name__", "") not in ("__get__", "__set__"):
                self.log.append((getattr(func, "__qualname__", getattr(func, "__name__", str(func))), dtypes))
            return out

    if device not in ("cuda", "cpu"):
        raise ValueError(f"trace_dtypes(device={device!r}): 'cuda' (real kernels, fake tensors) or 'cpu' (emulation)")
    if train and device == "cuda":
        raise ValueError("trace_dtypes: train=True needs autograd and BatchNorm's training kernel, which fake "
                         "CUDA tensors cannot run on a CPU build; use device='cpu'")
    record = Record()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        model = build()
        model.train(train)
        x = torch.empty(input_shape, device=device)
        target = torch.zeros(target_shape, dtype=torch.long if loss_fn is torch.nn.functional.cross_entropy
                             else torch.float32, device=device)
        if device == "cuda":
            _fake_cuda_copy(model)
        with _traced_autocast(device, dtype), record:
            loss_fn(model(x), target)
    return record.log


def aten_dtypes(fn, *shapes, dtypes=None, device: str = "cuda",
                autocast_dtype: torch.dtype = torch.float16) -> list[dict]:
    """The ATen ops ``fn(*tensors)`` reaches under autocast ``autocast_dtype``, below autocast
    (a ``TorchDispatchMode``: what each kernel really received), with the dtypes of their tensor
    inputs and outputs, in order; views and ``prim`` ops left out. ``shapes`` are the shapes of
    the fake tensors passed to ``fn`` (``dtypes``: theirs, float32 by default; integer dtypes are
    zeros). ``device="cuda"``: fake CUDA tensors through the installed torch's real AutocastCUDA
    kernels (forward only, no GPU needed); ``"cpu"``: fake CPU tensors under
    ``cuda_autocast_rules()``, the emulation the predictor uses. E.g.
    ``aten_dtypes(F.cross_entropy, (2, 5, 8), (2, 8), dtypes=(torch.float16, torch.long))``.

    The two devices can differ below the autocast decision, in a composite op's own CUDA path:
    ``F.log_softmax(x16, 1)`` gets ``dtype=float32`` from autocast on both, and then CUDA runs
    ``_log_softmax(x16, half_to_float=True)`` where the CPU first copies ``x16`` to fp32. The
    output dtypes agree; the CPU's trace has the extra copy."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    if device not in ("cuda", "cpu"):
        raise ValueError(f"aten_dtypes(device={device!r}): 'cuda' (real kernels, fake tensors) or 'cpu' (emulation)")
    dtypes = tuple(dtypes or (torch.float32,) * len(shapes))
    if len(dtypes) != len(shapes):
        raise ValueError(f"aten_dtypes: {len(shapes)} shapes but {len(dtypes)} dtypes")

    def names(xs) -> tuple[str, ...]:
        xs = xs if isinstance(xs, (tuple, list)) else (xs,)
        return tuple(str(t.dtype).removeprefix("torch.") for t in xs if isinstance(t, torch.Tensor))

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.rows: list[dict] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            if not str(func).startswith("prim") and name not in ("view", "_unsafe_view", "detach"):
                self.rows.append({"aten op": str(func).removesuffix(".default"),
                                  "input dtypes": names(list(args) + list((kwargs or {}).values())),
                                  "output dtypes": names(out)})
            return out

    record = Record()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tensors = [torch.zeros(s, dtype=d, device=device) if not d.is_floating_point
                   else torch.empty(s, dtype=d, device=device) for s, d in zip(shapes, dtypes, strict=True)]
        with _traced_autocast(device, autocast_dtype), record:
            fn(*tensors)
    return record.rows


#: where ``loss_bytes_per_logit`` computes the cross-entropy: no autocast, on the fp16 logits inside
#: autocast (PyTorch's AMP examples, ``train.training_step``), or outside it on ``logits.float()``
LOSS_PLACES = ("fp32", "inside", "outside")


def loss_bytes_per_logit(where: str, logits_shape: tuple[int, ...] = (2, 5, 8, 16, 16)) -> float:
    """Float bytes ``F.cross_entropy`` keeps for backward per logit, under CUDA's autocast rules
    (``cuda_autocast_rules`` on CPU tensors): the logit-sized floating tensors its graph saves,
    each storage once, the labels left out. ``where``: one of ``LOSS_PLACES`` (4.0, 6.0 and 4.0:
    fp32 log-probabilities once; inside autocast an fp16 log-softmax output and its fp32 copy for
    the NLL; outside, on ``.float()``, fp32 once)."""
    if where not in LOSS_PLACES:
        raise ValueError(f"where={where!r}: use one of {LOSS_PLACES}")
    x = torch.randn(logits_shape, requires_grad=True)
    y = torch.zeros((logits_shape[0], *logits_shape[2:]), dtype=torch.long)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.detach()) or t.detach(), lambda t: t):
        if where == "fp32":
            torch.nn.functional.cross_entropy(x, y)
        else:
            with cuda_autocast_rules(), torch.autocast("cpu", dtype=torch.float16):
                out = x.half()  # under autocast the net's last convolution returns fp16
                if where == "inside":
                    torch.nn.functional.cross_entropy(out, y)
            if where == "outside":
                torch.nn.functional.cross_entropy(out.float(), y)
    floats = {t.data_ptr(): t for t in kept if t.is_floating_point() and t.numel() == x.numel()}
    return sum(t.nbytes for t in floats.values()) / x.numel()


guard(globals(), SetupError)

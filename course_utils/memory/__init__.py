"""Measuring memory with PyTorch's own machinery.

Three instruments, each naming its method in what it prints:

* ``SavedTensorMeter`` -- *saved-for-backward bytes*: every tensor autograd stores for the backward
  pass goes through ``torch.autograd.graph.saved_tensors_hooks``; we count its storage once (views
  and in-place results share a storage) and release it when autograd frees it. Device-independent:
  the same number on CPU and GPU. (Inside a checkpointed region ``torch.utils.checkpoint``'s own
  hooks take over: what a checkpoint keeps is not seen here; ``Prediction.after_forward`` is.)
* ``MemoryLog`` -- seed 000's hook table. A subclass of PyTorch's
  ``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode`` that sees every
  tensor an op creates and when it dies) with one row per module event: pre-forward, forward,
  pre-backward, backward. Columns: *live tensor bytes* tracked by MemTracker (parameters,
  gradients, optimizer state, activations, temporaries), saved-for-backward bytes, and on CUDA the
  allocator's own ``memory_allocated`` / ``memory_reserved``. A finished log holds figures, not
  tensors: it never keeps the measured model alive.
* ``predict_step`` -- the course's training step (``train.training_step``) run under the log on
  ``FakeTensorMode`` tensors: shapes and dtypes, no data, so seed 000's full-size U-Net is
  "trained" on a laptop CPU in about a second. By default it predicts what a CUDA GPU's
  ``max_memory_allocated`` shows in the **steady state** (step 2 and later: the optimizer's state
  exists), under **CUDA's autocast rules** (``amp_rules``), with Adam's multi-tensor (foreach)
  implementation as on CUDA and the allocator's 512-byte rounding. ``measure_step`` runs the same
  step on a GPU and reads the allocator.

What a prediction cannot see: the CUDA context (300-600 MiB, never in ``memory_allocated``, but
part of the card's memory), cuDNN/cuBLAS workspaces (scratch memory the convolution algorithms
allocate *through* the caching allocator, so it does count in ``memory_allocated`` on a GPU),
the caching allocator's reserved-but-free blocks (``memory_reserved - memory_allocated``), and
anything allocated outside PyTorch's dispatcher. ``gpu_report`` measures each on a GPU.

Where things are (every name below is also importable from ``course_utils.memory``):

* ``units``      -- ``MiB``, ``GiB``, ``mib``, ``tensor_bytes``;
* ``meters``     -- ``SavedTensorMeter`` (``SavedTensorModifiedError``: autograd's in-place check, which its
  hooks make), ``saved_tensors`` (``SavedTensor``), ``LiveBytes``, ``storage_key``;
* ``hook_table`` -- ``MemoryLog`` (``Row``, ``CATEGORIES``, ``CUDA_BLOCK_ROUNDING``, ``LOSS``, ``OPTIMIZER``), ``log_step``;
* ``predict``    -- ``predict_step`` (``Prediction``, ``MAX_ELEMENTS``, ``method_label``, ``prime_optimizer``,
  ``default_dtype``, ``make_optimizer``, ``target_spec``, ``adopt_fake_tensors``, ``build_fake``,
  ``cuda_dropout``)
  and its twin on a GPU, ``measure_step`` (``step_parts``: what it trains);
* ``oom``        -- ``largest_that_fits``, ``catch_oom``, ``explain_oom``, ``is_oom``;
* ``cuda``       -- ``cuda_peak`` (``CudaPeak``), ``memory_cap``, ``require_cuda``;
* ``transients`` -- ``OpTransients`` (``OpMemory``, ``CudaStats``, ``LiveBytesStats``, ``BLOCK``): what
  each op keeps and what it needs only while it runs (a cuDNN workspace, cuBLAS's), measured on a
  GPU op by op; ``op_memory_step``, ``measure_step``'s step so recorded; ``conv_operands``,
  ``align_ops`` (two recordings of a step paired op by op, ``BOOKKEEPING`` ops left out);
  ``OpMemory.from_dict`` (``OP_FIELDS``) reads a recorded row back;
* ``workspaces`` -- cuDNN's convolution workspaces added to a prediction at the op that takes them:
  ``WorkspaceRule`` (``TRANSPOSED_COPIES``, ``NO_WORKSPACE``, ``CONV_OPS``, ``exception``), ``predict_with_workspaces``
  (``WorkspacePeak``), ``peak_with_workspaces``, ``predict_ops``, ``cuda_rules``; a GPU run's recording
  of a step op by op (``recorded_ops``) and ``plot_ops``, the two drawn together.
"""

from .cuda import CudaPeak, cuda_peak, memory_cap, require_cuda
from .meters import LiveBytes, SavedTensor, SavedTensorMeter, SavedTensorModifiedError, saved_tensors, storage_key
from .oom import catch_oom, explain_oom, is_oom, largest_that_fits
from .predict import (
    MAX_ELEMENTS,
    Prediction,
    adopt_fake_tensors,
    build_fake,
    cuda_dropout,
    default_dtype,
    make_optimizer,
    measure_step,
    method_label,
    predict_step,
    prime_optimizer,
    step_parts,
    target_spec,
)
from .transients import (
    BLOCK,
    BOOKKEEPING,
    OP_FIELDS,
    CudaStats,
    LiveBytesStats,
    OpMemory,
    OpTransients,
    align_ops,
    conv_operands,
    op_memory_step,
)
from .units import GiB, MiB, mib, tensor_bytes
from .workspaces import (
    CONV_OPS,
    NO_WORKSPACE,
    TRANSPOSED_COPIES,
    WorkspacePeak,
    WorkspaceRule,
    cuda_rules,
    exception,
    peak_with_workspaces,
    predict_ops,
    predict_with_workspaces,
    plot_ops,
    recorded_ops,
)

#: hook_table's names, imported on first use (PEP 562): MemoryLog subclasses MemTracker, whose import
#: brings torch.distributed, DTensor, dynamo and inductor -- 1.8 of the 5.2 CPU-s of ``import
#: course_utils`` (tests/test_package_layout.py), paid by every kernel, grader sandbox and test worker that
#: never builds a hook table
_HOOK_TABLE = ("CATEGORIES", "CUDA_BLOCK_ROUNDING", "LOSS", "OPTIMIZER", "MemoryLog", "Row", "log_step")


def __getattr__(name: str):
    if name in _HOOK_TABLE:
        # lazy: MemTracker's import costs 1.8 CPU-s (see _HOOK_TABLE)
        from . import hook_table

        return getattr(hook_table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOOK_TABLE))


#: the public names (tests/test_package_layout.py checks that none of the submodules' is missing)
__all__ = [
    "CudaPeak", "cuda_peak", "memory_cap", "require_cuda",
    "CATEGORIES", "CUDA_BLOCK_ROUNDING", "LOSS", "OPTIMIZER", "MemoryLog", "Row", "log_step",
    "LiveBytes", "SavedTensor", "SavedTensorMeter", "SavedTensorModifiedError", "saved_tensors", "storage_key",
    "catch_oom", "explain_oom", "is_oom", "largest_that_fits",
    "MAX_ELEMENTS", "Prediction", "adopt_fake_tensors", "build_fake", "cuda_dropout", "default_dtype", "make_optimizer", "measure_step", "method_label",
    "predict_step", "prime_optimizer",
    "step_parts", "target_spec",
    "BLOCK", "BOOKKEEPING", "OP_FIELDS", "CudaStats", "LiveBytesStats", "OpMemory", "OpTransients", "align_ops", "conv_operands",
    "op_memory_step",
    "CONV_OPS", "NO_WORKSPACE", "TRANSPOSED_COPIES", "WorkspacePeak", "WorkspaceRule", "cuda_rules", "exception",
    "peak_with_workspaces", "predict_ops", "predict_with_workspaces", "plot_ops", "recorded_ops",
    "GiB", "MiB", "mib", "tensor_bytes",
]

"""Mutation check: hand-written bugs, planted one at a time in a copy of the repository, that the unit tests must catch.
Usage: python tools/mutants.py [MODULE ...] [--only ID ...] [--list] [--jobs N] [--allow-survivors] [--json FILE]
       make mutation  (MUTATE="memory unet ..." picks modules; a module is course_utils/NAME.py or course_utils/NAME/)

Each mutant is ``(file, exact old text, new text, description)``: the old text must occur exactly
once in the file (a mutant whose text is gone after a refactoring is reported as stale, never
silently skipped). The working tree is copied once to a temporary directory (per job); each
mutant is written into that copy, the module's unit-test files run there (``pytest -x
--timeout``, ``PYTHONPATH`` = the copy, no bytecode written), and the file is restored. Outcome:
``killed`` (a test failed), ``survived`` (every test passed: a bug the tests let through),
``timeout`` (a test hung past ``--test-timeout``, or the whole run past ``--mutant-timeout``:
caught, but slowly), ``error`` (pytest stopped, e.g. the mutant broke an import: caught),
``config-error`` (pytest found no such test: fix the mutant's tests). Before the mutants, the
same tests run once unmutated and must pass.
Mutants marked ``equivalent=True`` (no test can tell them apart: the description says why) are
listed but not run unless ``--run-equivalent``. Exit status: 0 if no mutant survived (or
``--allow-survivors``), 1 if one did, 2 on a stale mutant, a config-error or a failing baseline.

Tests for a module: ``TESTS[module]``, else ``tests/test_<module>.py`` (tests/README.md's map); a
test written to kill a mutant goes in that file and names the mutant in its docstring. A
mutant may name its own (``tests=``: pytest node ids, to keep slow files out) or add some
(``extra_tests=``). A new module (e.g. ``grading``, a package: ``course_utils/grading/``) needs
its mutants appended to ``MUTANTS`` and its test files in ``TESTS``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "course_utils"


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repository root
    old: str  # exact text, must occur once
    new: str
    description: str
    tests: tuple[str, ...] = ()  # pytest node ids / files instead of the module's
    equivalent: bool = False  # no test can tell it apart: the description says why
    extra_tests: tuple[str, ...] = ()  # run in addition to the module's tests

    @property
    def module(self) -> str:
        parts = Path(self.file).parts
        if len(parts) >= 2 and parts[0] == PACKAGE:
            return Path(parts[1]).stem if len(parts) == 2 else parts[1]
        return Path(self.file).stem


# --------------------------------------------------------------------------------------------
# The tests each module's mutants run against
# --------------------------------------------------------------------------------------------
TESTS: dict[str, tuple[str, ...]] = {
    "memory": ("tests/test_memory.py", "tests/test_allocator_sim.py"),
    "unet": ("tests/test_foundation.py",),
    "config": ("tests/test_foundation.py",),
    "inplace_abn": ("tests/test_inplace_abn.py",),
    "parallel": ("tests/test_parallel.py", "tests/test_parallel_gpu_paths.py"),
    "allocator": ("tests/test_allocator_sim.py",),
    "amp_rules": ("tests/test_amp_rules.py",),
    "train": ("tests/test_foundation.py", "tests/test_memory.py"),
    "explorer": ("tests/test_explorer.py",),
    "budget": ("tests/test_explorer.py", "tests/test_fit.py"),  # the explorer's and fit's budgets are Overheads
    "loops": ("tests/test_loops.py", "tests/test_memory.py"),
    "gpu_kit": ("tests/test_gpu_report.py",),
}
LAUNCH, PAR_TESTS = "tests/test_parallel_launch.py", "tests/test_parallel.py"


def tests_for(m: Mutant) -> tuple[str, ...]:
    if m.tests:
        return m.tests
    return TESTS.get(m.module, (f"tests/test_{m.module}.py",)) + m.extra_tests


# --------------------------------------------------------------------------------------------
# The mutants
# --------------------------------------------------------------------------------------------
M = Mutant
CU = PACKAGE + "/"
MUTANTS: list[Mutant] = []  # filled in below
UNET, CFG, ABN = CU + "unet.py", CU + "config.py", CU + "inplace_abn.py"
# course_utils/memory/ is a package: each mutant names the file its text is in (module "memory")
MEM = CU + "memory/"
MEM_METERS, MEM_LOG, MEM_PREDICT, MEM_OOM = (MEM + "meters.py", MEM + "hook_table.py", MEM + "predict.py",
                                             MEM + "oom.py")
ALLOC, AMP, TRAIN, EXPL = CU + "allocator.py", CU + "amp_rules.py", CU + "train.py", CU + "explorer.py"
# course_utils/parallel/ is a package: each mutant names the file its text is in (module "parallel")
PAR = CU + "parallel/"
PAR_LAUNCH, PAR_DP, PAR_FSDP, PAR_PIPE = (PAR + "launcher.py", PAR + "data_parallel.py", PAR + "fsdp.py",
                                          PAR + "pipeline.py")
NUM = CU + "numerics.py"
MEM_TRANS = MEM + "transients.py"
# course_utils/gpu_kit/ is a package: each mutant names the file its text is in (module "gpu_kit")
KIT = CU + "gpu_kit/"
KIT_BUDGET, KIT_RECORD, KIT_PLAN, KIT_DIAG = KIT + "budget.py", KIT + "record.py", KIT + "plan.py", KIT + "diagnose.py"

MUTANTS += [
    # -- memory: SavedTensorMeter ----------------------------------------------------------
    M("meter-counts-storage-twice", MEM_METERS,
      "        elif key not in self._refs:\n            nbytes = t.untyped_storage().nbytes()",
      "        else:\n            nbytes = t.untyped_storage().nbytes()",
      "SavedTensorMeter counts a storage each time it is saved (ReLU's output and the next "
      "conv's input twice)"),
    M("meter-no-release", MEM_METERS,
      "            self.current -= self._bytes.pop(key)",
      "            self._bytes.pop(key)",
      "SavedTensorMeter never releases a storage when autograd frees it"),
    M("meter-params-as-activations", MEM_METERS,
      "        if key in self._param_keys:\n            if key not in self._refs:",
      "        if False:\n            if key not in self._refs:",
      "SavedTensorMeter counts saved parameters (a conv's weight) as activation bytes"),
    M("meter-peak-not-updated", MEM_METERS,
      "            self.current += nbytes\n            self.peak = max(self.peak, self.current)",
      "            self.current += nbytes",
      "SavedTensorMeter.peak never updated"),
    M("meter-release-decrements-twice", MEM_METERS,
      "        self._refs[key] -= 1",
      "        self._refs[key] -= 2",
      "SavedTensorMeter's release decrements the reference count twice (KeyErrors in finalizers)"),
    M("meter-param-bytes-every-save", MEM_METERS,
      "            if key not in self._refs:\n                self.param_bytes +=",
      "            if True:\n                self.param_bytes +=",
      "SavedTensorMeter.param_bytes adds a parameter each time it is saved (a weight used twice)"),
    # -- memory: LiveBytes -----------------------------------------------------------------
    M("livebytes-no-free", MEM_METERS,
      "        if size is not None:\n            self.current -= size",
      "        if size is not None:\n            pass",
      "LiveBytes never frees a storage that died"),
    M("livebytes-views-counted-again", MEM_METERS,
      "        if key in self._live or st.nbytes() == 0:",
      "        if st.nbytes() == 0:",
      "LiveBytes counts a view / in-place result again although it shares a live storage"),
    M("livebytes-no-rounding", MEM_METERS,
      "        return -(-n // self.round_to) * self.round_to",
      "        return n",
      "LiveBytes ignores round_to (no 512-byte blocks)"),
    # -- memory: the predictor ---------------------------------------------------------------
    M("rounding-512-off", MEM_LOG,
      "        return -(-mem // CUDA_BLOCK_ROUNDING) * CUDA_BLOCK_ROUNDING",
      "        return mem",
      "MemoryLog's CUDA block rounding does not round (512-byte rounding off)"),
    M("predict-rounding-flag-off", MEM_PREDICT,
      "                       round_like_cuda=target == \"cuda\", loop=loop)",
      "                       round_like_cuda=False, loop=loop)",
      "predict_step never asks for the CUDA allocator's 512-byte blocks"),
    M("predict-dropout-cpu", MEM_PREDICT,
      "    dropout = cuda_dropout() if target == \"cuda\" else contextlib.nullcontext()",
      "    dropout = contextlib.nullcontext()",
      "predict_step for CUDA keeps the CPU's float dropout noise instead of CUDA's bool mask"),
    M("predict-steady-state-ignored", MEM_PREDICT,
      "        if steady_state and opt is not None:",
      "        if False and opt is not None:",
      "predict_step ignores steady_state (prime_optimizer skipped: Adam's state missing)"),
    M("predict-adam-is-sgd", MEM_PREDICT,
      "        return torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)",
      "        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=foreach)",
      "make_optimizer builds SGD with momentum for 'adam' (one state tensor instead of two)"),
    M("predict-no-foreach", MEM_PREDICT,
      "        opt = make_optimizer(optimizer, model, foreach=target == \"cuda\")",
      "        opt = make_optimizer(optimizer, model, foreach=False)",
      "predict_step for CUDA uses the single-tensor Adam, not CUDA's default foreach one "
      "(different temporaries in the optimizer step)"),
    M("predict-no-optimizer-step", MEM_LOG,
      "        training_step(model, x, target, optimizer, loss_fn=loss_fn, autocast_dtype=autocast_dtype)",
      "        training_step(model, x, target, None, loss_fn=loss_fn, autocast_dtype=autocast_dtype)",
      "log_step (so predict_step) runs the step without its optimizer: no zero_grad, no step()"),
    M("prime-keeps-zero-grads", CU + "loops.py",
      "    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)",
      "    optimizer.step()\n    optimizer.zero_grad(set_to_none=False)",
      "prime_optimizer leaves zero-filled gradients instead of None. EQUIVALENT: training_step's "
      "first act is zero_grad(set_to_none=True), which frees them before anything else is "
      "allocated, so no peak, breakdown or after-forward figure can change (a real loop's step 2 "
      "also starts with the previous gradients resident)", equivalent=True),
    M("log-keeps-grad-hooks", MEM_LOG,
      "            for handle in self._grad_hooks:\n                handle.remove()",
      "            for handle in self._grad_hooks:\n                pass",
      "MemoryLog does not remove MemTracker's multi-grad hooks (the model stays alive)"),
    M("log-peak-phase-swapped", MEM_LOG,
      "            return \"backward\"\n        return \"forward\" if",
      "            return \"forward\"\n        return \"forward\" if",
      "MemoryLog.peak_location calls a backward peak 'forward'"),
    M("log-module-peaks-always", MEM_LOG,
      "        if self.module_peaks:\n            super()._update_peak_stats(peak_state)",
      "        if True:\n            super()._update_peak_stats(peak_state)",
      "module_peaks=False ignored (MemTracker's per-module bookkeeping always on). EQUIVALENT: "
      "the global peak and its breakdown are the same either way (test_memory checks it); only "
      "the time differs", equivalent=True),
    # -- memory: OOM and budgets ---------------------------------------------------------------
    M("catch-oom-keeps-traceback", MEM_OOM,
      "        self.error = _drop_traceback(exc)",
      "        self.error = exc",
      "catch_oom stores the exception with its traceback (the failed attempt's tensors stay alive)"),
    M("is-oom-misses-cpu-oom", MEM_OOM,
      "        and (\"out of memory\" in text or \"can't allocate memory\" in text)",
      "        and (\"out of memory\" in text)",
      "is_oom no longer recognises the CPU's failed allocation (\"can't allocate memory\")"),
    M("largest-bisection-off-by-one", MEM_OOM,
      "    while hi - lo > 1:",
      "    while hi - lo > 2:",
      "largest_that_fits stops bisecting one step early"),
    M("largest-limit-bound-off-by-one", MEM_OOM,
      "        hi = limit\n    while hi - lo > 1:",
      "        hi = limit - 1\n    while hi - lo > 1:",
      "largest_that_fits bisects below limit - 1 when limit itself does not fit"),
]

MUTANTS += [
    # -- unet ---------------------------------------------------------------------------------
    M("up-pads-the-wrong-side", UNET,
      "            pad += [d // 2, d - d // 2]",
      "            pad += [d - d // 2, d // 2]",
      "Up pads an odd difference before instead of after (the map shifts by one voxel)"),
    M("up-concat-order", UNET,
      "        return self.conv(torch.cat([skip, x], dim=1))",
      "        return self.conv(torch.cat([x, skip], dim=1))",
      "Up concatenates [upsampled, skip] instead of seed 000's [skip, upsampled]"),
    M("lean-up-concat-order", UNET,
      "torch.cat([skip, self.pad_to(self.up(x).to(skip.dtype), skip)], dim=1)",
      "torch.cat([self.pad_to(self.up(x).to(skip.dtype), skip), skip], dim=1)",
      "Up(lean=True) concatenates in the other order than the default Up",
      extra_tests=("tests/test_amp_rules.py::test_lean_up_computes_the_same_and_saves_memory_only_under_autocast",)),
    M("count-parameters-ignores-frozen", UNET,
      "if p.requires_grad or not trainable_only)",
      "if True)",
      "count_parameters counts frozen parameters (trainable_only ignored)"),
    M("conv-checkpoint-drops-last-unit", UNET,
      "isinstance(m, nn.Conv3d)] + [len(mods)]",
      "isinstance(m, nn.Conv3d)]",
      "checkpoint='conv' runs only the first conv unit of each DoubleConv",
      extra_tests=("tests/test_checkpointing.py",)),
    M("decoder-channels-not-halved", UNET,
      "    return tuple([c // 2 for c in skips[:-1]] + [channels[0]])",
      "    return tuple([c for c in skips[:-1]] + [channels[0]])",
      "default_decoder_channels keeps the skip's width instead of half of it"),
    # -- config -------------------------------------------------------------------------------
    M("course-size-not-normalised", CFG,
      "    key = size.strip().lower()",
      "    key = size",
      "COURSE_SIZE / size not normalised (' Tiny ' refused)"),
    M("course-size-empty-not-unset", CFG,
      "        size = os.environ.get(ENV_VAR) or None",
      "        size = os.environ.get(ENV_VAR)",
      "an empty COURSE_SIZE (COURSE_SIZE= make test) is an unknown preset instead of unset"),
    M("preset-default-ignores-cuda", CFG,
      "        size = \"full\" if device.type == \"cuda\" else \"tiny\"",
      "        size = \"tiny\"",
      "the default preset on a GPU is tiny instead of full"),
    # -- inplace_abn --------------------------------------------------------------------------
    M("abn-ignores-momentum", ABN,
      "            self.momentum, self.eps, self.slope,",
      "            0.1, self.eps, self.slope,",
      "InPlaceABN ignores the user's momentum (always 0.1)"),
    M("abn-ignores-eps", ABN,
      "            self.momentum, self.eps, self.slope,",
      "            self.momentum, 1e-5, self.slope,",
      "InPlaceABN ignores the user's eps (always 1e-5)"),
    M("abn-invstd-fixed-eps", ABN,
      "        invstd = torch.rsqrt(var + eps)",
      "        invstd = torch.rsqrt(var + 1e-5)",
      "1/std uses a fixed eps instead of the given one"),
    M("abn-running-var-biased", ABN,
      "                    unbiased = var * (count / (count - 1))",
      "                    unbiased = var",
      "running_var updated with the biased variance (BatchNorm uses the unbiased one)"),
    M("abn-eval-backward-as-training", ABN,
      "        if ctx.training:\n            m = z.numel()",
      "        if True:\n            m = z.numel()",
      "backward in eval mode subtracts the batch-statistics terms"),
    M("abn-weight-sign-ignored", ABN,
      "        dweight = (dscale * ctx.weight_sign).to(scale.dtype)",
      "        dweight = dscale.to(scale.dtype)",
      "the gradient of a negative gamma has the wrong sign (d|gamma|/dgamma ignored)"),
    M("abn-stats-in-half", ABN,
      "    if x.dtype == acc:\n        return torch.var_mean(x, dim=dims, correction=0)",
      "    if True:\n        return torch.var_mean(x, dim=dims, correction=0)",
      "batch statistics of an fp16/bf16 input computed in fp16/bf16"),
    M("abn-dbias-in-half", ABN,
      "        dbias = dy.sum(dims, dtype=acc)",
      "        dbias = dy.sum(dims)",
      "the bias gradient of an fp16 input summed in fp16 (overflows past 65,504)"),
]

_LAUNCH_FAIL = LAUNCH + "::test_a_failure_stops_every_rank_at_once_and_nothing_survives"
MUTANTS += [
    # -- parallel: launch ---------------------------------------------------------------------
    M("launch-no-deadline", PAR_LAUNCH,
      "                if remaining <= 0:\n                    timed_out = True",
      "                if False:\n                    timed_out = True",
      "launch never enforces timeout_s (a hung rank runs until a collective gives up, or forever)",
      tests=(LAUNCH + "::test_past_the_deadline_the_hung_rank_is_named_and_nothing_survives",)),
    M("launch-no-group-kill", PAR_LAUNCH,
      "                os.killpg(p.pid, signal.SIGKILL)",
      "                pass",
      "launch kills the ranks but not their process groups (what a worker started is orphaned)",
      tests=(_LAUNCH_FAIL,)),
    M("launch-no-reap", PAR_LAUNCH,
      "            p.join(timeout=10)",
      "            pass",
      "launch does not reap the killed ranks (zombies)",
      tests=(_LAUNCH_FAIL,)),
    M("launch-blames-the-waiter", PAR_LAUNCH,
      "        culprit, waiter = first(hung), first(waited)\n",
      "        culprit, waiter = first(waited), first(waited)\n",
      "a hung rank's peer, which timed out waiting in a collective, is blamed",
      tests=(LAUNCH + "::test_a_hung_rank_is_blamed_not_the_peer_that_timed_out",)),
    M("launch-signal-unnamed", PAR_LAUNCH,
      "            return f\"killed by signal {signal.Signals(-code).name}\"",
      "            return f\"killed by signal {-code}\"",
      "a rank killed by a signal is reported by number, not by name (no hint)",
      tests=(LAUNCH + "::test_a_rank_killed_by_a_signal_is_named_with_the_signal[SIGKILL]",)),
    M("launch-peer-gone-is-a-cause", PAR_LAUNCH,
      "            if any(s in rec[\"error\"] for s in _PEER_GONE):",
      "            if False:",
      "a rank that failed because its peer closed the connection is treated as a cause",
      tests=(LAUNCH + "::test_a_rank_that_lost_its_peer_is_not_blamed_even_if_it_ended_first",)),
    # -- parallel: the demos' arithmetic ------------------------------------------------------
    M("cross-replica-bn-var-within-only", NUM,
      "    var = (m2s + counts * (means - mean).square()).sum(0) / n",
      "    var = m2s.sum(0) / n",
      "combine_moments (CrossReplicaBatchNorm3d's, GlobalBatchNorm's) drops the between-rank term of Chan's variance formula"),
    M("1f1b-warmup-one-more", PAR_PIPE,
      "    warm = min(stages - 1 - stage, m)",
      "    warm = min(stages - stage, m)",
      "1F1B fills the pipe with one forward too many per stage"),
    M("fsdp-working-forgets-unsharded-grads", PAR_FSDP,
      "               \"unsharded grads\": (size + root_still) * b,",
      "               \"unsharded grads\": 0,",
      "fsdp_backward_moments leaves out the working unit's unsharded gradient"),
    M("stage-of-downs-in-decoder", PAR_PIPE,
      "    return 0 if name.split(\".\")[0] in (\"inc\", \"downs\") else 1",
      "    return 0 if name.split(\".\")[0] in (\"inc\",) else 1",
      "stage_of puts the Down blocks in the decoder stage"),
    M("pipeline-layouts-1f1b-keeps-two", PAR_PIPE,
      "saved[s] * min(2 - s, b) / b) for s in (0, 1)}",
      "saved[s] * min(2, b) / b) for s in (0, 1)}",
      "pipeline_layouts: under 1F1B the last stage keeps two micro-batches instead of one",
      tests=(PAR_TESTS + "::test_pipeline_layouts_1f1b_keeps_s_minus_stage_micro_batches",
             PAR_TESTS + "::test_pipeline_layouts_compare_like_with_like_and_count_buckets")),
    M("relative-error-absolute", NUM,
      "    return diff / scale if scale else (0.0 if diff == 0 else math.inf)",
      "    return diff",
      "relative_error returns the absolute difference"),
    # -- numerics: BatchNorm's running statistics (tiling, spatial, CrossReplicaBatchNorm3d) ------
    M("running-var-biased", NUM,
      "        unbiased = var.detach() * count / max(count - 1, 1)",
      "        unbiased = var.detach()",
      "update_running_stats averages the biased variance into running_var (nn.BatchNorm: unbiased)"),
    M("running-stats-momentum-none-fixed", NUM,
      "        f = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum",
      "        f = 0.1 if bn.momentum is None else bn.momentum",
      "update_running_stats uses momentum 0.1 where momentum=None asks for a cumulative average"),
    # -- allocator (the caching-allocator model) ----------------------------------------------
    M("allocator-first-fit", ALLOC,
      "        block = min(fits, key=lambda b: (b.size, b.segment, b.offset))  # best fit",
      "        block = fits[0]  # first fit",
      "SimulatedAllocator takes the first free block that fits instead of the best fit"),
    M("allocator-large-split-threshold", ALLOC,
      "        if rest >= MIN_BLOCK if pool == \"small\" else rest > SMALL_SIZE:",
      "        if rest >= MIN_BLOCK if pool == \"small\" else rest >= MIN_BLOCK:",
      "large-pool blocks split whenever 512 B remain (CUDA: only if more than 1 MiB remains)"),
    M("allocator-small-never-split", ALLOC,
      "        if rest >= MIN_BLOCK if pool == \"small\" else rest > SMALL_SIZE:",
      "        if rest > SMALL_SIZE if pool == \"small\" else rest > SMALL_SIZE:",
      "small-pool blocks split only if more than 1 MiB remains (never: each takes a 2 MiB segment)"),
    M("allocator-no-merge-next", ALLOC,
      "        if i + 1 < len(blocks) and blocks[i + 1].free:  # merge with the next free block",
      "        if False:  # merge with the next free block",
      "a freed block is not merged with the free block after it"),
    M("allocator-no-merge-previous", ALLOC,
      "        if i > 0 and blocks[i - 1].free:  # and with the previous one",
      "        if False:  # and with the previous one",
      "a freed block is not merged with the free block before it"),
    M("allocator-no-retry-after-empty-cache", ALLOC,
      "                self.empty_cache()\n",
      "",
      "at the cap, cached free segments are not returned before declaring an OOM"),
    M("allocator-10mib-boundary", ALLOC,
      "        if n < MIN_LARGE_ALLOC:",
      "        if n <= MIN_LARGE_ALLOC:",
      "a request of exactly 10 MiB shares a 20 MiB segment (CUDA: size < kMinLargeAlloc)"),
    M("allocator-1mib-boundary", ALLOC,
      "        pool = \"small\" if size <= SMALL_SIZE else \"large\"",
      "        pool = \"small\" if size < SMALL_SIZE else \"large\"",
      "a request of exactly 1 MiB goes to the large pool (CUDA: size <= kSmallSize)"),
    M("trace-step-single-tensor-adam", ALLOC,
      "        opt = torch.optim.Adam(model.parameters(), foreach=True) if optimizer else None",
      "        opt = torch.optim.Adam(model.parameters(), foreach=False) if optimizer else None",
      "trace_step replays single-tensor Adam instead of CUDA's default foreach Adam"),
    # -- amp_rules ----------------------------------------------------------------------------
    M("autocast-rules-null-for-cuda", AMP,
      "    if device is None or device == \"cpu\":",
      "    if device is None or device in (\"cpu\", \"cuda\"):",
      "autocast_rules('cuda') returns a null context: predictions for a GPU use the CPU's rules"),
    M("amp-cpu-only-ops-still-cast", AMP,
      "                    lib.impl(name, torch.library.fallthrough_kernel, \"AutocastCPU\")",
      "                    pass",
      "ops only the CPU casts (max_pool3d, cat, cross_entropy) keep their CPU autocast casts"),
    M("amp-fp32-policy-not-applied", AMP,
      "                dt = torch.float32 if policy == \"fp32\" else torch.float16\n",
      "                dt = torch.float32 if policy == \"fp32\" else torch.float16\n"
      "                if policy == \"fp32\":\n                    return op(*args, **kwargs)\n",
      "ops on CUDA's fp32 list (upsample_trilinear3d, mse_loss) are not cast to float32"),
    M("amp-weight-cast-not-cached", AMP,
      "    if cacheable:\n        hit = _cache.get(id(t))",
      "    if False:\n        hit = _cache.get(id(t))",
      "fp32 weights are cast again at every use instead of once per autocast region"),
    M("amp-cache-not-cleared", AMP,
      "    _cache.clear()\n    _clear_autocast_cache()",
      "    _clear_autocast_cache()",
      "the weight-cast cache survives the autocast region (a stale fp16 copy after opt.step())"),
    M("amp-lower-precision-always-fp16", AMP,
      "                dt = torch.get_autocast_dtype(\"cpu\")\n                return op(*_cast(args, dt)",
      "                dt = torch.float16\n                return op(*_cast(args, dt)",
      "bfloat16 autocast runs convolutions in float16 under the CUDA rules"),
    M("amp-unknown-ops-accepted", AMP,
      "    if unknown:",
      "    if False:",
      "a torch that registers CUDA autocast ops of unknown policy is accepted silently"),
]

MUTANTS += [
    # -- train --------------------------------------------------------------------------------
    M("train-step-no-optimizer-step", TRAIN,
      "        else:\n            optimizer.step()",
      "        else:\n            pass",
      "training_step never calls optimizer.step() (no GradScaler)"),
    M("train-step-no-zero-grad", TRAIN,
      "    if optimizer is not None and not in_backward:\n        optimizer.zero_grad(set_to_none=set_to_none)",
      "    if optimizer is not None and not in_backward:\n        pass",
      "training_step does not clear the last step's gradients (they accumulate)"),
    M("train-step-autocast-off", TRAIN,
      "dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None)",
      "dtype=autocast_dtype or torch.float16, enabled=False)",
      "training_step ignores autocast_dtype (step_autocast never switches autocast on)"),
    M("train-step-loss-not-scaled", TRAIN,
      "    (scaler.scale(loss) if scaler is not None else loss).backward()",
      "    loss.backward()",
      "with a GradScaler the loss is not scaled (scaler.step then unscales unscaled gradients)"),
    M("dice-empty-is-zero", TRAIN,
      "    return float(sum(scores) / len(scores)) if scores else 1.0",
      "    return float(sum(scores) / len(scores)) if scores else 0.0",
      "dice_score of an all-background target and prediction is 0 instead of 1"),
    M("train-one-pass-over-a-generator", TRAIN,
      "        yield from itertools.cycle(seen)\n        return",
      "        return",
      "train() stops after one pass over a finite generator instead of cycling"),
    M("train-ignores-lr", TRAIN,
      "    opt = torch.optim.Adam(model.parameters(), lr=lr)",
      "    opt = torch.optim.Adam(model.parameters())",
      "train() ignores its lr argument"),
    # -- explorer -----------------------------------------------------------------------------
    M("explorer-temporaries-fixed", EXPL,
      "PER_SAMPLE = (\"activations\", \"temporaries\")",
      "PER_SAMPLE = (\"activations\",)",
      "the explorer holds temporaries constant when it scales the batch"),
    M("explorer-local-batch-floor", EXPL,
      "    local = -(-cfg.batch // cfg.dp_ranks)  # ceil: the fullest rank",
      "    local = cfg.batch // cfg.dp_ranks  # ceil: the fullest rank",
      "an uneven global batch is split by floor: the fullest rank is underestimated"),
    M("explorer-no-rounding-correction", EXPL,
      "    while largest and over.needed(sum(_parts(lines, largest).values())) > budget:",
      "    while False:",
      "the largest batch is not corrected for the rounding of each part. EQUIVALENT for every "
      "input: each part of a probe is a multiple of 512 bytes (CUDA blocks) divided by the probe "
      "batch 2, so parts at any batch are whole bytes and rounding never moves a total; the loop "
      "can fire only on a floating-point tie where needed() exceeds the budget by less than one "
      "byte, which card_needs (int) and fits cannot show", equivalent=True),
    M("budget-overheads-no-slack", CU + "budget.py",
      "        return predicted_peak * (1 + self.slack) + self.workspace_bytes + self.context_mib * MiB",
      "        return predicted_peak + self.workspace_bytes + self.context_mib * MiB",
      "Overheads.needed leaves out the slack"),
    M("budget-workspaces-left-out", CU + "budget.py",
      "        return (card_bytes - self.context_mib * MiB - self.workspace_bytes) / (1 + self.slack)",
      "        return (card_bytes - self.context_mib * MiB) / (1 + self.slack)",
      "Overheads.usable forgets the cuBLAS workspaces fit adds as a line of the budget"),
    M("budget-usable-no-context", CU + "budget.py",
      "        return (card_bytes - self.context_mib * MiB - self.workspace_bytes) / (1 + self.slack)",
      "        return (card_bytes - self.workspace_bytes) / (1 + self.slack)",
      "Overheads.usable leaves the CUDA context out of what a card holds (estimate's correction loop, "
      "which uses needed, hid it from the explorer's tests)"),
    M("loops-keep-grads-ignored", CU + "loops.py",
      "                             set_to_none=not self.keep_grads, accumulate=k,",
      "                             set_to_none=True, accumulate=k,",
      "Loop.run frees the gradients that keep_grads keeps (zero_grad(set_to_none=True) always)"),
    M("loops-accumulate-one-micro-batch", CU + "loops.py",
      "        k = self.accumulate if micro_batches is None else max(1, min(self.accumulate, micro_batches))",
      "        k = 1",
      "Loop.run runs one micro-batch whatever accumulate says (gradients never coexist with a forward)"),
    M("explorer-inplace-relu-ignored", EXPL,
      "(bn_relu_inplace if cfg.inplace_relu else bn_relu)",
      "(bn_relu if cfg.inplace_relu else bn_relu)",
      "the in-place ReLU switch builds the plain net"),
    M("explorer-lean-up-ignored", EXPL,
      "lean_up=cfg.lean_up, offload_activations=cfg.offload)",
      "lean_up=False, offload_activations=cfg.offload)",
      "the lean Up switch builds the plain net"),
    M("explorer-cache-key-forgets-offload", EXPL,
      'NOT_IN_MODEL_KEY = frozenset({"batch", "dp_ranks", "budget_gib"})',
      'NOT_IN_MODEL_KEY = frozenset({"batch", "dp_ranks", "budget_gib", "offload"})',
      "Config.model_key leaves out offload: an offloaded configuration reuses the plain prediction"),
    M("explorer-probe-module-peaks", EXPL,
      "                        autocast_dtype=ac, module_peaks=False)",
      "                        autocast_dtype=ac, module_peaks=True)",
      "the probe (and the direct prediction) keeps MemTracker's per-module peaks. EQUIVALENT: the global peak and its "
      "breakdown are the same (test_memory checks it); only the time differs", equivalent=True),
]


MUTANTS += [
    # -- memory: OpTransients (what each op keeps and needs only while it runs) ----------------
    M("transient-from-before-only", MEM_TRANS,
      "        return max(0, self.peak - max(self.before, self.after))",
      "        return max(0, self.peak - self.before)",
      "an op's transient counts its own outputs as scratch memory", tests=("tests/test_op_transients.py",)),
    M("transient-phase-always-forward", MEM_TRANS,
      'str(func.overloadpacket.__name__), "forward" if node is None',
      'str(func.overloadpacket.__name__), "forward" if True',
      "backward ops are tagged forward", tests=("tests/test_op_transients.py",)),
    M("transient-inputs-counted-as-outputs", MEM_TRANS,
      "        created = {k: st for k, st in _storages(tree_leaves(out)).items() if k not in inputs}",
      "        created = dict(_storages(tree_leaves(out)))",
      "an in-place op's or a view's input storage counted as a new output", tests=("tests/test_op_transients.py",)),
    M("largest-hint-trusted-blindly", MEM_OOM,
      "                return hint if not once(hint + 1) else largest_that_fits(once, hint + 1, limit, at_limit)",
      "                return hint",
      "largest_that_fits returns a hint that fits without checking that the next does not",
      tests=("tests/test_op_transients.py",)),
    # -- gpu_kit: budget, resume, output files, plan, diagnosis ----------------------------------
    M("kit-starts-what-does-not-fit", KIT_BUDGET,
      "        if task.estimate_s > left:",
      "        if task.estimate_s > left + 1e9:",
      "a task past the budget is started anyway"),
    M("kit-stops-at-the-first-task-that-does-not-fit", KIT_BUDGET,
      "            log(f\"{task.name}: {NOT_RUN} ({rec.error})\")",
      "            log(f\"{task.name}: {NOT_RUN} ({rec.error})\")\n            records.append(rec)\n            on_record(rec)\n"
      "            for later in tasks[len(records):]:\n"
      "                records.append(Record(later.name, later.estimate_s, later.source, NOT_RUN))\n            break",
      "a task that does not fit stops the plan: a shorter one after it never runs"),
    M("kit-forgets-the-grandchildren", KIT_BUDGET,
      "    victims = {**(seen or {}), **_descendants(proc.pid)}",
      "    victims = {}",
      "a command's processes in sessions of their own (a kernel) outlive its deadline"),
    M("kit-resumes-from-a-dry-run", KIT_RECORD,
      "        if bool(state.get(\"dry_run\")) == dry_run:\n            for t in state[\"tasks\"]:",
      "        if True:\n            for t in state[\"tasks\"]:",
      "a dry run on a CPU counts as a GPU run's task done"),
    M("kit-archive-over-its-limit", KIT_RECORD,
      "    while len(data) > limit:",
      "    while False:",
      "an archive larger than a GPU call returns is written as it is"),
    M("kit-notebooks-by-number", KIT_PLAN,
      "    return [p for *_, p in sorted(rows, key=lambda r: r[:3])]",
      "    return [p for *_, p in sorted(rows, key=lambda r: r[2])]",
      "the notebooks run in number order, not those with the most GPU cells first"),
    M("kit-settings-not-restored", KIT_DIAG,
      "        for k, v in saved.items():\n            setattr(*_SWITCHES[k], v)",
      "        pass",
      "the diagnosis leaves cuDNN's autotuner or cuDNN itself off for every later task"),
]
INTAKE, INTAKE_TESTS = CU + "grading/intake.py", ("tests/test_grading_intake.py",)  # module "grading"; fast tests
MUTANTS += [
    M("intake-outputs-counted", INTAKE, "    if _drop_outputs(nb):", "    if False:",
      "a notebook's saved outputs count against the 64 MiB cap on code", tests=INTAKE_TESTS),
    M("intake-shared-leaves-once", INTAKE, "            depth, leaves = max(depth, d + 1), leaves + n",
      "            depth, leaves = max(depth, d + 1), leaves + (n if n == 1 else 1)",
      "an observation's shared children counted once: 2^60 leaves pass as 120", tests=INTAKE_TESTS),
    M("intake-surrogates-kept", INTAKE, '        text = text.encode("utf-8", "backslashreplace").decode("utf-8")',
      "        pass", "a lone surrogate in a learner's text reaches the report's print", tests=INTAKE_TESTS),
]

# --------------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------------
@dataclass
class Result:
    id: str
    module: str
    outcome: str  # killed | survived | timeout | error | equivalent (not run)
    seconds: float
    detail: str = ""
    description: str = ""
    equivalent: bool = False
    tests: list[str] = field(default_factory=list)


def check_applies(m: Mutant, root: Path = ROOT) -> str | None:
    """None if ``m`` applies to the file under ``root``, else why not."""
    path = root / m.file
    if not path.exists():
        return f"{m.file} does not exist"
    n = path.read_text().count(m.old)
    if n != 1:
        return f"its old text occurs {n} times in {m.file} (must be exactly once)"
    if m.old == m.new:
        return "old and new text are the same"
    return None


def copy_tree(dest: Path) -> None:
    """The working tree as it is (tracked and untracked, not ignored files) into ``dest``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
        files = [f for f in listed if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but caches
        skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)
_TIMEOUT = re.compile(r"Timeout \(>[\d.]+s\) from pytest-timeout", re.M)


def run_pytest(copy: Path, tests: tuple[str, ...], test_timeout: float, run_timeout: float,
               first_failure: bool = True) -> tuple[str, float, str, str]:
    """(outcome, seconds, first failing test, output tail) of pytest on ``tests`` in ``copy``."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1",
               COURSE_SIZE=os.environ.get("COURSE_SIZE", "tiny"), MPLBACKEND="Agg",
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
           f"--timeout={test_timeout:g}", *(["-x"] if first_failure else []), *tests]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=run_timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the session this run started, nothing else
        out, _ = proc.communicate()
        rc = None
    secs = time.monotonic() - start
    text = out.decode("utf-8", "replace")
    failed = _FAILED.findall(text)
    if rc is None:
        return "timeout", secs, f"(whole run > {run_timeout:g} s)", text[-3000:]
    if rc == 0:
        passed = re.search(r"(\d+) passed", text)
        return "survived", secs, f"{passed.group(1) if passed else '?'} tests passed", text[-3000:]
    if rc == 1:
        hung = _TIMEOUT.search(text)
        return ("timeout" if hung else "killed"), secs, (failed[0] if failed else "?"), text[-3000:]
    # 4: usage error (a test file or node id that does not exist), 5: no test collected -- the
    # mutant's test selection is wrong, which says nothing about the mutant
    kind = "config-error" if rc in (4, 5) else "error"
    return kind, secs, f"pytest exit code {rc}" + (f": {failed[0]}" if failed else ""), text[-3000:]



def run_mutant(m: Mutant, copy: Path, args) -> Result:
    path = copy / m.file
    original = path.read_text()
    tests = tests_for(m)
    path.write_text(original.replace(m.old, m.new, 1))
    try:
        outcome, secs, by, tail = run_pytest(copy, tests, args.test_timeout, args.mutant_timeout)
    finally:
        path.write_text(original)
    if args.verbose and outcome in ("survived", "error", "config-error"):
        print(tail)
    return Result(m.id, m.module, outcome, round(secs, 1), by, m.description, m.equivalent, list(tests))


def select(modules: list[str], only: list[str]) -> list[Mutant]:
    known = {m.module for m in MUTANTS}
    unknown = [x for x in modules if x not in known]
    if unknown:
        raise ValueError(f"no mutants for module(s) {unknown}; modules with mutants: {sorted(known)}")
    chosen = [m for m in MUTANTS if (not modules or m.module in modules)]
    if only:
        ids = {m.id for m in MUTANTS}
        missing = [i for i in only if i not in ids]
        if missing:
            raise ValueError(f"unknown mutant id(s) {missing}: see --list")
        chosen = [m for m in chosen if m.id in only]
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="course_utils modules to mutate (default: all with mutants)")
    ap.add_argument("--only", nargs="+", default=[], metavar="ID", help="run these mutants only")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy")
    ap.add_argument("--allow-survivors", action="store_true", help="report survivors, exit 0")
    ap.add_argument("--run-equivalent", action="store_true", help="run the mutants marked equivalent too")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--test-timeout", type=float, default=120, help="pytest-timeout per test (s)")
    ap.add_argument("--mutant-timeout", type=float, default=600, help="limit for one mutant's run (s)")
    ap.add_argument("--json", type=Path, help="write the results to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output for survivors")
    args = ap.parse_args(argv)

    duplicates = sorted({m.id for m in MUTANTS if [x.id for x in MUTANTS].count(m.id) > 1})
    try:
        if duplicates:
            raise ValueError(f"mutant ids must be unique: {duplicates}")
        chosen = select(args.modules, args.only)
    except ValueError as err:
        print(f"mutants.py: {err}", file=sys.stderr)
        return 2
    stale = [(m, why) for m in chosen if (why := check_applies(m))]
    if args.list:
        for m in chosen:
            flag = " [equivalent]" if m.equivalent else ""
            print(f"{m.id:40s} {m.module:12s} {m.description}{flag}\n{'':53s}tests: {' '.join(tests_for(m))}")
        print(f"{len(chosen)} mutants")
    if stale:
        for m, why in stale:
            print(f"STALE mutant {m.id}: {why}. Update it in tools/mutants.py.", file=sys.stderr)
        return 2
    if args.list:
        return 0
    to_run = [m for m in chosen if args.run_equivalent or not m.equivalent]
    results: list[Result] = [Result(m.id, m.module, "equivalent (not run)", 0.0, "", m.description, True)
                             for m in chosen if m not in to_run]
    jobs = max(1, min(args.jobs, len(to_run) or 1))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        copies = [Path(tmp) / f"copy{j}" for j in range(jobs)]
        for c in copies:
            c.mkdir()
            copy_tree(c)
        if not args.no_baseline:
            union = tuple(dict.fromkeys(t for m in to_run for t in tests_for(m)))
            print(f"baseline: {len(union)} test selections, unmutated ...", flush=True)
            outcome, secs, by, tail = run_pytest(copies[0], union, args.test_timeout,
                                                 args.mutant_timeout * 3, first_failure=False)
            if outcome != "survived":
                print(tail)
                print(f"baseline failed ({outcome}: {by}) after {secs:.0f} s: the unmutated tests must "
                      "pass before mutants mean anything", file=sys.stderr)
                return 2
            print(f"baseline passed in {secs:.0f} s", flush=True)
        free = list(copies)
        lock = threading.Lock()

        def one(m: Mutant) -> Result:
            with lock:
                copy = free.pop()
            try:
                r = run_mutant(m, copy, args)
            finally:
                with lock:
                    free.append(copy)
            print(f"{r.outcome:9s} {r.seconds:6.1f} s  {m.id}" + (f"  <- {r.detail}" if r.detail else ""),
                  flush=True)
            return r

        with ThreadPoolExecutor(jobs) as pool:
            results += list(pool.map(one, to_run))
    total = time.monotonic() - started
    order = {m.id: i for i, m in enumerate(MUTANTS)}
    results.sort(key=lambda r: order[r.id])

    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    print(f"\n{'mutant':40s} {'module':12s} {'outcome':22s} {'s':>6s}  killed by / description")
    for r in results:
        print(f"{r.id:40s} {r.module:12s} {r.outcome:22s} {r.seconds:6.1f}  "
              + (r.detail if r.outcome in ("killed", "timeout", "error", "config-error")
                 else f"{r.description} ({r.detail})" if r.detail else r.description))
    survivors = [r for r in results if r.outcome == "survived" and not r.equivalent]
    print(f"\n{len(results)} mutants: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
          + f"; {total / 60:.1f} min")
    if survivors:
        print("SURVIVORS (bugs the tests let through):")
        for r in survivors:
            print(f"  {r.id}: {r.description}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    misconfigured = [r.id for r in results if r.outcome == "config-error"]
    if misconfigured:
        print(f"mutants whose tests could not be selected (fix their tests= / TESTS): {misconfigured}",
              file=sys.stderr)
        return 2
    return 1 if survivors and not args.allow_survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())

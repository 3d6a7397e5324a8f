"""course_utils: the small helper package of the GPU-memory course.

One concept a module (tests/test_layout.py checks that every module is listed here):

* ``config``         -- ``setup()``: device (CUDA if present) and size preset (``COURSE_SIZE``)
* ``unet``           -- the 3D U-Net of seed 000, block by block
* ``data``           -- synthetic 5-class 3D segmentation volumes
* ``train``          -- a training step, a short loop, the Dice score
* ``memory``         -- (a package) saved-for-backward meter, hook table (MemTracker), GPU-free
                        peak predictor, CUDA peaks, out-of-memory explained
* ``amp_rules``      -- CUDA's autocast rules on a CPU, checked against the real AutocastCUDA kernels
* ``tf32``           -- TF32: ``exact_fp32()`` for comparisons, ``emulate_tf32()`` for CI
* ``allocator``      -- the CUDA caching allocator: snapshots, expandable segments, its model
* ``recorded``       -- figures recorded on a GPU, shown (with their origin) where there is none
* ``session_cache``  -- predictions computed once for all the processes of one test session
* ``limit_test``     -- seed 003's Conv3d 1-4-8-1 memory-limit net
* ``tiling``         -- (a package) a volume trained in slabs: the derived halo, the exact tiled
                        step (BatchNorm included), its memory predicted and measured
* ``spatial``        -- spatial parallelism: one slab per rank, halos exchanged
* ``numerics``       -- ``relative_error`` and BatchNorm's arithmetic, shared by tiling, spatial
                        and parallel
* ``inplace_abn``    -- In-Place Activated BatchNorm (BN + leaky ReLU, stores only its output)
* ``compare``        -- ``technique_table``: baseline vs technique in one table; ``step_time``
* ``checkpointing``  -- BN-safe checkpointing, selective policy, sqrt(n) stack, DenseNet block
* ``densenet``       -- seed 004's DenseNet-169 on 512 x 512 X-rays, naive and memory-efficient
* ``full_resolution`` -- seed 004 at the X-rays' own 2000 x 2000: the pixel model, sides per card, batch 1
* ``densenet_spatial`` -- DenseNet-169's image split across ranks: halo exchange, global BatchNorm
* ``parallel``       -- (a package) DDP, FSDP2 and pipeline workers launched from a notebook or
                        torchrun, cross-replica BatchNorm, schedules, layouts
* ``parallel_plots`` -- drawings for notebooks 08 and 09: per-rank memory, pipeline schedules
* ``explorer``       -- every technique as a switch: predicted memory and the largest batch
* ``fit``            -- does my network fit? every technique applied to any nn.Module, with a CLI
* ``fit_examples``   -- ResNet-18 2D, ViT-tiny, a 1D conv net: networks the course does not teach
* ``benchmark``      -- every technique on seed 000's U-Net, predicted and (on a GPU) measured
* ``gpu_report``     -- the GPU kit's command: the course on a CUDA GPU within a budget of seconds,
                        recorded as it goes, resumed where a recorded run stopped
* ``gpu_kit``        -- (a package) the kit's plan, budget, output files, op-by-op diagnosis, tasks
* ``readme``         -- README's figures, computed, and its generated tables
* ``hosted``         -- the course on a hosted GPU notebook: the notebooks' setup cell, what a T4
                        runs (predicted), ``make dist`` (the wheel and the learner's zip)
* ``scaffold``       -- a new notebook with its exercise from ``templates/``; the course's layout checks
* ``grading``        -- (a package) the exercises' checks (one module each), generator, student
                        release, grader
* ``exercises``, ``grade`` -- old command lines kept working: ``python -m course_utils.exercises``
                        (now ``grading.generate``) and ``python -m course_utils.grade``
                        (now ``grading.grade``)
"""

from .config import PRESETS, CourseSetup, Preset, setup
from .data import CLASS_NAMES, N_CLASSES, SyntheticVolumes, make_volume
from .memory import (
    MiB,
    Prediction,
    SavedTensorMeter,
    catch_oom,
    cuda_peak,
    explain_oom,
    largest_that_fits,
    mib,
    predict_step,
    saved_tensors,
    tensor_bytes,
)
from .train import dice_score, train, train_step
from .unet import DoubleConv, Down, OutConv, UNet3D, Up, count_parameters, seed000_unet


def __getattr__(name: str):
    # MemoryLog and log_step load PyTorch's MemTracker on first use (course_utils.memory)
    if name in ("MemoryLog", "log_step"):
        from . import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PRESETS", "CourseSetup", "Preset", "setup",
    "CLASS_NAMES", "N_CLASSES", "SyntheticVolumes", "make_volume",
    "MiB", "MemoryLog", "Prediction", "SavedTensorMeter", "catch_oom", "cuda_peak",
    "explain_oom", "largest_that_fits", "log_step", "mib", "predict_step", "saved_tensors",
    "tensor_bytes",
    "dice_score", "train", "train_step",
    "DoubleConv", "Down", "OutConv", "UNet3D", "Up", "count_parameters", "seed000_unet",
]

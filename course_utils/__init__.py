"""course_utils: the small helper package of the GPU-memory course.

One concept a module, in six layers, lowest first. A module imports from its own layer or a lower
one, never from a higher one, and no imports form a cycle, function-level imports included; a
function-level import of a course module says why it waits (``# lazy: ...``, e.g. the 1.8 CPU-s of
MemTracker's import). No module imports a private name (``_x``) of another package or top-level
module. ``tests/test_package_layout.py`` checks all of it against the lists below.

Layer 1 -- foundations: of the course, they import only ``checks`` and ``files``, the first two

* ``checks``         -- bad input refused where it is made: ``CourseError`` and one subclass per
                        module family, the fix in every message; ``guard`` checks every public
                        function's arguments against its annotations
* ``files``          -- files written whole or not at all (``atomic_write``), read with the file and
                        the fix named in every error (``read_json``)
* ``config``         -- ``setup()``: device (CUDA if present) and size preset (``COURSE_SIZE``)
* ``data``           -- synthetic 5-class 3D segmentation volumes
* ``numerics``       -- ``relative_error`` and BatchNorm's arithmetic, shared by tiling, spatial
                        and parallel
* ``session_cache``  -- predictions computed once for all the processes of one test session
* ``recorded``       -- figures recorded on a GPU, shown (with their origin) where there is none
* ``amp_rules``      -- CUDA's autocast rules on a CPU, from the dispatcher's registrations
* ``tf32``           -- TF32: ``exact_fp32()`` for comparisons, ``emulate_tf32()`` for CI
* ``cost``           -- what a step costs on a card: spec-sheet rates (``CARDS``), counted bytes
* ``markdown``       -- link targets and code spans of Markdown, for the layout checks and the release
* ``layout``         -- the course's file names (a lesson, its exercise ``NN_topic_exercise``, its solution) and titles
* ``parallel_plots`` -- drawings for notebooks 08 and 09: per-rank memory, pipeline schedules
* ``fit_examples``   -- ResNet-18 and -50 2D, ViT-tiny, a 1D conv net: networks the course does not teach
* ``fit_published``  -- published GPU memory figures, and the networks they were measured on

Layer 2 -- the training step and its measurement

* ``train``          -- a training step, a short loop, the Dice score
* ``loops``          -- the training loops people run, as data: optimizer, kept gradients,
                        accumulation, optimizer in backward, forward-only modes
* ``memory``         -- (a package) saved-for-backward meter, hook table (MemTracker), GPU-free
                        peak predictor, CUDA peaks, out-of-memory explained

Layer 3 -- techniques and budgets, on any network

* ``checkpointing``  -- BN-safe checkpointing, selective policy, sqrt(n) stack, DenseNet block
* ``inplace_abn``    -- In-Place Activated BatchNorm (BN + leaky ReLU, stores only its output)
* ``budget``         -- what a card holds beyond a prediction: ``Overheads``, usable bytes,
                        the batch model, DDP's buckets
* ``compare``        -- ``technique_table``: baseline vs technique in one table; ``step_time``
* ``allocator``      -- the CUDA caching allocator: snapshots, expandable segments, its model
* ``limit_test``     -- seed 003's Conv3d 1-4-8-1 memory-limit net

Layer 4 -- the course's networks

* ``unet``           -- the 3D U-Net of seed 000, block by block, and its headline prediction
* ``densenet``       -- seed 004's DenseNet-169 on 512 x 512 X-rays, naive and memory-efficient

(``course_utils`` itself, this file, re-exports the names of layers 1-4 a notebook uses most.)

Layer 5 -- tools built on them

* ``tiling``         -- (a package) a volume trained in slabs: the derived halo, the exact tiled
                        step (BatchNorm included), its memory predicted and measured
* ``parallel``       -- (a package) DDP, FSDP2 and pipeline workers launched from a notebook or
                        torchrun, cross-replica BatchNorm, schedules, layouts
* ``spatial``        -- spatial parallelism: one slab per rank, halos exchanged
* ``densenet_spatial`` -- DenseNet-169's image split across ranks: halo exchange, global BatchNorm
* ``full_resolution`` -- seed 004 at the X-rays' own 2000 x 2000: the pixel model, sides per card, batch 1
* ``explorer``       -- every technique as a switch: predicted memory and the largest batch
* ``fit``            -- does my network fit? every technique applied to any nn.Module, with a CLI
* ``fit_model``      -- the learner's network as ``fit`` sees it: checked, built on fake tensors,
                        its blocks, each technique applied
* ``fit_report``     -- what ``fit`` found: rows, summary, tables, plots, ``--json``'s data
* ``fit_validation`` -- ``fit`` against ``fit_published``'s figures: ratios, docs/fit-validation.md
* ``benchmark``      -- every technique on seed 000's U-Net, predicted and (on a GPU) measured
* ``amp_check``      -- ``amp_rules`` checked op by op on the course's nets against the real
                        AutocastCUDA kernels (``python -m course_utils.amp_check``)

Layer 6 -- the course's own machinery

* ``grading``        -- (a package) the exercises' checks (one module each), generator, student
                        release, grader
* ``gpu_kit``        -- (a package) the GPU kit's plan, budget, output files, op-by-op diagnosis, tasks
* ``gpu_report``     -- the GPU kit's command: the course on a CUDA GPU within a budget of seconds,
                        recorded as it goes, resumed where a recorded run stopped
* ``scaffold``       -- a new notebook with its exercise from ``templates/``; the course's layout checks
* ``readme``         -- README's figures, computed, and its generated tables
* ``hosted``         -- the course on a hosted GPU notebook: the notebooks' setup cell, what a T4
                        runs (predicted), ``make dist`` (the wheel and the learner's zip)
* ``exercises``, ``grade`` -- old command lines kept working: ``python -m course_utils.exercises``
                        (now ``grading.generate``) and ``python -m course_utils.grade``
                        (now ``grading.grade``)
"""

from . import memory
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

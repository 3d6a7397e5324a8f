"""course_utils: the small helper package of the GPU-memory course.

One concept a module:

* ``config``     -- ``setup()``: device (CUDA if present) and size preset (``COURSE_SIZE``)
* ``unet``       -- the 3D U-Net of seed 000, block by block
* ``data``       -- synthetic 5-class 3D segmentation volumes
* ``train``      -- a training step, a short loop, the Dice score
* ``memory``     -- saved-for-backward meter, hook table (MemTracker), GPU-free peak predictor,
                    CUDA peaks, out-of-memory explained
* ``amp_rules``  -- CUDA's autocast rules on a CPU, checked against the real AutocastCUDA kernels
* ``tf32``       -- TF32: ``exact_fp32()`` for comparisons, ``emulate_tf32()`` for CI
* ``allocator``  -- the CUDA caching allocator: snapshots, expandable segments
* ``limit_test`` -- seed 003's Conv3d 1-4-8-1 memory-limit net
* ``inplace_abn`` -- In-Place Activated BatchNorm (BN + leaky ReLU, stores only its output)
* ``compare``    -- ``technique_table``: baseline vs technique in one table; ``step_time``
* ``checkpointing`` -- BN-safe checkpointing, selective policy, sqrt(n) stack, DenseNet block
* ``parallel``   -- DDP, FSDP2 and GPipe workers launched from a notebook or torchrun
* ``explorer``   -- every technique as a switch: predicted memory and the largest batch
* ``grading``    -- the exercises' checks (one module each), generator, student release, grader
"""

from .config import PRESETS, CourseSetup, Preset, setup
from .data import CLASS_NAMES, N_CLASSES, SyntheticVolumes, make_volume
from .memory import (
    MiB,
    MemoryLog,
    Prediction,
    SavedTensorMeter,
    catch_oom,
    cuda_peak,
    explain_oom,
    largest_that_fits,
    log_step,
    mib,
    predict_step,
    saved_tensors,
    tensor_bytes,
)
from .train import dice_score, train, train_step
from .unet import DoubleConv, Down, OutConv, UNet3D, Up, count_parameters, seed000_unet

__all__ = [
    "PRESETS", "CourseSetup", "Preset", "setup",
    "CLASS_NAMES", "N_CLASSES", "SyntheticVolumes", "make_volume",
    "MiB", "MemoryLog", "Prediction", "SavedTensorMeter", "catch_oom", "cuda_peak",
    "explain_oom", "largest_that_fits", "log_step", "mib", "predict_step", "saved_tensors",
    "tensor_bytes",
    "dice_score", "train", "train_step",
    "DoubleConv", "Down", "OutConv", "UNet3D", "Up", "count_parameters", "seed000_unet",
]

"""Split the volume, not the network: a tiled training step for convolution chains.

A 3x3x3 convolution (stride 1, padding 1) needs, for each output voxel, only the input voxels
one step away. A chain of such layers needs ``halo = sum((k - 1) // 2 * dilation)`` voxels on
each side: its *receptive field*. So a volume can be trained in **slabs** (tiles): each slab
reads the voxels it owns plus a halo of that width from its neighbours, runs forward and
backward on that piece alone, and computes the loss only on the voxels it owns. Summed over the
slabs, the losses are the full volume's loss and the weight gradients accumulate to the
full-volume gradient -- exactly, not approximately (``tests/test_tiling.py`` checks it in
float64). Memory then holds one slab's activations at a time instead of the whole volume's.

How the pieces fit together:

* ``conv_chain(model)`` walks the model's modules (``nn.Sequential`` chains of stride-1 "same"
  convolutions, point-wise activations and BatchNorm) and *derives* the halo per spatial axis;
  anything whose receptive field cannot be read off the modules (pooling, upsampling, a module
  with its own ``forward``) is refused with an error that says why and what to do.
  ``probe_halo(model)`` measures the same halo independently, from the support of one output
  voxel's input gradient.
* ``plan_tiles(shape, tiles, halo)`` cuts the volume: each ``Tile`` has the region it *owns*
  and the region it *reads* (owned + halo, clipped at the volume's border).
* ``tiled_step(model, x, target, tiles)`` is the training step: gradients accumulate in
  ``.grad`` as after ``loss.backward()`` of the untiled step; it returns the loss.

Where things are (every name below is also importable from ``course_utils.tiling``):

* ``halo``    -- the derivation: ``conv_chain`` (``ConvChain``, ``Layer``), ``probe_halo``,
  ``TilingError``, and the module kinds it knows (``POINTWISE``, ``CONVS``, ``BATCHNORMS``,
  ``DROPOUTS``) or refuses (``WHOLE_VOLUME_NORMS``, ``RESAMPLING``);
* ``plan``    -- ``plan_tiles`` and ``Tile``: what each slab owns and reads (``MAX_TILES`` at once);
* ``step``    -- running a chain on a slab (``run_chain``, ``region``, ``work_factor``) and the
  training step (``tiled_step``, ``TiledStep``), with the untiled reference (``full_step``,
  ``grads_of``, ``compare_with_untiled``); its docstring explains the zero padding at the
  border and BatchNorm's extra sweeps;
* ``predict`` -- the memory prediction under FakeTensorMode: ``predict_tiled_step``,
  ``representative``, ``largest_tiled_n``;
* ``plots``   -- ``draw_tiles``, ``draw_shrinking``, ``seed003_table``, ``draw_memory_vs_n``;
* ``cuda``    -- the step measured for real: ``measure_tiled_step``, ``measure_seed003_cuda``.

``relative_error``, ``normalise``, ``update_running_stats`` and ``uses_batch_stats`` live in
``course_utils.numerics``; they are importable from here too, as before the split.
"""

from ..numerics import normalise, relative_error, update_running_stats, uses_batch_stats
from .cuda import measure_seed003_cuda, measure_tiled_step
from .halo import (
    BATCHNORMS,
    CONVS,
    DROPOUTS,
    POINTWISE,
    RESAMPLING,
    WHOLE_VOLUME_NORMS,
    ConvChain,
    Layer,
    TilingError,
    conv_chain,
    probe_halo,
)
from .plan import MAX_TILES, Tile, plan_tiles
from .plots import draw_memory_vs_n, draw_shrinking, draw_tiles, seed003_table
from .predict import largest_tiled_n, predict_tiled_step, representative
from .step import TiledStep, compare_with_untiled, full_step, grads_of, region, run_chain, tiled_step, work_factor

#: the public names, submodule by submodule (tests/test_package_layout.py checks that none is missing)
__all__ = [
    "normalise", "relative_error", "update_running_stats", "uses_batch_stats",
    "measure_seed003_cuda", "measure_tiled_step",
    "BATCHNORMS", "CONVS", "DROPOUTS", "POINTWISE", "RESAMPLING", "WHOLE_VOLUME_NORMS", "ConvChain",
    "Layer", "TilingError", "conv_chain", "probe_halo",
    "MAX_TILES", "Tile", "plan_tiles",
    "draw_memory_vs_n", "draw_shrinking", "draw_tiles", "seed003_table",
    "largest_tiled_n", "predict_tiled_step", "representative",
    "TiledStep", "compare_with_untiled", "full_step", "grads_of", "region", "run_chain", "tiled_step",
    "work_factor",
]

"""Data, model and pipeline parallelism with ``torch.distributed``: the same code on CPU (gloo,
processes on one machine, as in CI) and on GPUs (NCCL, one process per GPU).

Words used here (the notebooks define them at first use): a *rank* is one process of the job
(0 .. world size - 1), the *world size* the number of ranks; *all-reduce* leaves on every rank the
sum (or mean) of a tensor over all ranks, *all-gather* leaves on every rank the concatenation of
every rank's tensor, *reduce-scatter* sums over ranks and leaves each rank one slice of the sum.

From a notebook, ``launch(worker, world_size, config)`` spawns the processes (workers must live
in an importable module, so they live in this package) and returns each rank's result;
``launch_many`` runs several workers in one start. Every collective has a timeout and ``launch`` a deadline, so a
failed, killed or stuck rank becomes a clear error naming that rank, never a hang. Under
``torchrun`` the same workers run through ``main()``::

    torchrun --standalone --nproc-per-node=2 -m course_utils.parallel --mode ddp --steps 3

Workers:

* ``ddp_worker``      -- DistributedDataParallel on the U-Net: gradients, per-rank memory;
* ``fsdp_worker``     -- FSDP2 ``fully_shard``: per-rank parameter/gradient/optimizer bytes, at
  rest and while a unit runs (``FSDPMemTracker``);
* ``pipeline_worker`` -- the U-Net split in two stages, one per rank, micro-batches scheduled
  GPipe or 1F1B; per-rank timelines (the bubble) and saved-for-backward peaks;
* ``pipelining_worker`` -- the same with ``torch.distributed.pipelining``'s own schedules;
* ``norm_worker``     -- ``CrossReplicaBatchNorm3d`` against one BatchNorm on the whole batch.

Where things are (every name below is also importable from ``course_utils.parallel``):

* ``launcher``      -- ``launch``, ``launch_many``, ``LaunchError``, ``LaunchTimeout``,
  ``backend_for``, ``rendezvous_store``, ``compared``, ``leave_without_teardown``: spawning the
  ranks, where they meet, deadlines, a finished rank's exit, the failing rank named (``_entry``,
  ``_Output``, ``_dump_stacks``, ``_stop``, ``_diagnose``);
* ``data_parallel`` -- ``ddp_worker``, ``CrossReplicaBatchNorm3d``, ``norm_worker``, the demos'
  net and batch (``build_net``, ``NORMS``, ``global_batch``), ``single_process_grads``,
  ``accumulated_grads``, ``per_replica_bn_errors``, ``relative_error``, ``whole_batch_saved_bytes``,
  ``all_gather`` (across torch's rename of its functional all-gather);
* ``tolerance``     -- ``reference_grads`` (float64 reference, fp32's error against it),
  ``ranks_order_grads`` (fp32 in the ranks' own arithmetic), ``tf32_errors``, ``tf32_branches``,
  ``branch_margin``;
* ``fsdp``          -- ``fsdp_worker``, ``fsdp_units``, ``fsdp_unit_names``, ``fsdp_rank_memory``,
  ``fsdp_backward_moments``, ``fsdp_forward_moments``, ``BACKWARD_PREFETCH``, ``moments_table`` and ``fsdp_timeline`` (notebook 08's
  table and time line);
* ``pipeline``      -- ``EncoderStage``, ``DecoderStage``, ``TwoStageUNet``,
  ``split_and_reference``, ``schedule_order``, ``replay_schedule``, ``gpipe_idle``, ``bubble_table``,
  ``stage_durations``, ``OpTimer``,
  ``pipeline_worker``, ``pipelining_worker``, ``pipeline_layouts`` and their helpers;
* ``cli``           -- ``main`` (``python -m``/``torchrun -m course_utils.parallel``, through
  ``__main__``), ``train_worker``, ``torchrun_backend``, ``torchrun_command``, the failure demos
  ``failing_worker`` and ``stuck_worker``, and ``source_worker`` (exercise 08's grader).
"""

import torch.distributed as dist  # noqa: F401  (tests patch ``parallel.dist``, as before the split)

from .cli import failing_worker, main, source_worker, stuck_worker, torchrun_backend, torchrun_command, train_worker
from .data_parallel import (
    NORMS,
    CrossReplicaBatchNorm3d,
    accumulated_grads,
    all_gather,
    build_net,
    cross_replica_bn_relu,
    ddp_worker,
    global_batch,
    gn_relu,
    norm_worker,
    per_replica_bn_errors,
    relative_error,
    relu_only,
    single_process_grads,
    state_bytes,
    whole_batch_saved_bytes,
)
from .fsdp import (
    BACKWARD_PREFETCH,
    fsdp_backward_moments,
    fsdp_forward_moments,
    fsdp_rank_memory,
    fsdp_timeline,
    fsdp_unit_names,
    fsdp_units,
    fsdp_worker,
    moments_table,
)
from .launcher import (
    COLLECTIVE_TIMEOUT_S,
    LaunchError,
    LaunchTimeout,
    backend_for,
    compared,
    launch,
    launch_many,
    leave_without_teardown,
    rendezvous_store,
)
from .pipeline import (
    SCHEDULES,
    bubble_table,
    DecoderStage,
    EncoderStage,
    OpTimer,
    TwoStageUNet,
    bubble_fraction,
    gpipe_idle,
    in_flight,
    pipeline_layouts,
    pipeline_worker,
    pipelining_worker,
    replay_schedule,
    replay_timelines,
    schedule_order,
    split_and_reference,
    stage_durations,
    stage_of,
    stage_parameters,
    stage_saved_bytes,
    unit_durations,
)
from .tolerance import branch_margin, ranks_order_grads, reference_grads, tf32_branches, tf32_errors

#: the public names, submodule by submodule (tests/test_package_layout.py checks that none is missing)
__all__ = [
    "failing_worker", "main", "source_worker", "stuck_worker", "torchrun_backend", "torchrun_command",
    "train_worker",
    "NORMS", "CrossReplicaBatchNorm3d", "accumulated_grads", "all_gather", "build_net", "cross_replica_bn_relu",
    "ddp_worker", "global_batch", "gn_relu", "norm_worker", "per_replica_bn_errors", "relative_error",
    "relu_only", "single_process_grads", "state_bytes", "whole_batch_saved_bytes",
    "BACKWARD_PREFETCH", "fsdp_backward_moments", "fsdp_forward_moments", "fsdp_rank_memory", "fsdp_timeline", "fsdp_unit_names",
    "fsdp_units", "fsdp_worker", "moments_table",
    "COLLECTIVE_TIMEOUT_S", "LaunchError", "LaunchTimeout", "backend_for", "compared",
    "launch", "launch_many", "leave_without_teardown", "rendezvous_store",
    "SCHEDULES", "bubble_table", "DecoderStage", "EncoderStage", "OpTimer", "TwoStageUNet", "bubble_fraction", "gpipe_idle",
    "in_flight", "pipeline_layouts", "pipeline_worker", "pipelining_worker", "replay_schedule",
    "replay_timelines", "schedule_order", "split_and_reference", "stage_durations", "stage_of", "stage_parameters",
    "stage_saved_bytes", "unit_durations",
    "branch_margin", "ranks_order_grads", "reference_grads", "tf32_branches", "tf32_errors",
]

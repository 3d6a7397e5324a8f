"""The GPU kit's parts (``python -m course_utils.gpu_report`` is its command line).

Layers, each importing only those above it:

* ``plan``          -- the tasks in order, their expected seconds and where those come from
                       (standard library only);
* ``budget``        -- running tasks within a budget: start only what fits, stop what overruns,
                       commands whose whole process tree ends at a deadline (standard library only);
* ``record``        -- the output folder within a GPU call's return limits, written whole after
                       every task; recorded runs read back to resume (standard library only);
* ``nbval_record``  -- a pytest plugin that keeps the notebook nbval executed (``record``'s atomic writes);
* ``diagnose``      -- why a prediction misses on a GPU, op by op (``memory.OpTransients``);
* ``tasks``         -- every task as a function of the run (``Kit``); the benchmark, examples,
                       tests and notebooks;
* ``summary``       -- ``summary.md`` from a run's state;
* ``importer``      -- a returned run put into docs/gpu-runs/, recorded/ and benchmarks/results/.
"""

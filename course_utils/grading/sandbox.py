"""The sandbox: the process where a submission's graded code runs for the checks.

``python -m course_utils.grading.sandbox SPEC.json``, started by the grader with its working
folder, ``PYTHONPATH`` and ``HOME`` in the submission's scratch folder, a per-exercise copy of
``course_utils`` in which this exercise's answers and every reference are removed
(``strip``), and nothing of the teacher's repository. It

1. limits itself (memory, file size, Landlock where the kernel has it),
2. rebuilds the graded objects from the notebook's code, with the top-level statements they
   need (``notebook_code``),
3. observes each requested part (``Exercise.observe``) and saves the observation with
   ``torch.save`` to ``obs/<part>.pt`` -- data only, which the grader loads with
   ``weights_only=True`` and judges in its own process.

Before a part starts it writes ``obs/<part>.started``; the grader kills the sandbox when a part
runs past its time and starts a new one for the parts after it.
"""

from __future__ import annotations

import json
import os
import sys

from . import limits
from .notebook_code import graded_objects, rebuild
from .registry import exercise


def observe_notebook(nb, nn_id: str, keys, seed: int, save=None, on_rebuilt=None) -> dict:
    """Rebuild ``nb``'s graded objects and observe parts ``keys``; returns {key: data} and calls
    ``save(key, data)`` after each part (the sandbox writes it to disk there)."""
    ex = exercise(nn_id)
    rebuilt = rebuild(nb, graded=ex.names)  # only the statements the graded names need run
    objects = graded_objects(rebuilt, ex.names)
    out = {"__rebuild__": {"problems": rebuilt.problems, "sources": rebuilt.sources,
                           "dropped": [d.as_dict() for d in rebuilt.dropped]}}
    if on_rebuilt is not None:
        on_rebuilt(out["__rebuild__"])
    for key in keys:
        if save is not None:
            save(key, None)
        out[key] = ex.observe(key, objects, seed)
        if save is not None:
            save(key, out[key])
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.grading.sandbox SPEC.json``: limit this process, rebuild the
    notebook's graded objects, observe the requested parts into ``obs/``, and exit at once."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    obs = spec["obs_dir"]
    os.environ["COURSE_GRADER_SANDBOX"] = "1"

    status = limits.sandbox_self(spec["scratch"], spec.get("memory_bytes"), spec.get("file_bytes"),
                                  use_landlock=spec.get("landlock", True))
    with open(os.path.join(obs, "_sandbox.json"), "w") as f:
        json.dump({"landlock": status}, f)

    import nbformat
    import torch

    nb = nbformat.read(spec["notebook"], as_version=4)

    def save(key, data):
        if data is None:
            with open(os.path.join(obs, f"{key}.started"), "w"):
                pass
            return
        tmp = os.path.join(obs, f"{key}.pt.tmp")
        torch.save(data, tmp)
        os.replace(tmp, os.path.join(obs, f"{key}.pt"))

    def rebuilt(info):
        with open(os.path.join(obs, "_rebuild.json"), "w") as f:
            json.dump(info, f)

    observe_notebook(nb, spec["exercise"], spec["parts"], int(spec["seed"]), save, rebuilt)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the learner's atexit handlers and threads stay out


if __name__ == "__main__":
    sys.exit(main())

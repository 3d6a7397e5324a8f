"""Start the IPython kernel that runs a submission, under the submission's limits.

The runner's kernel spec calls ``python -m course_utils.grading.kernel_launch SPEC.json -f
{connection_file}``: this limits the process (memory, file size, Landlock), imports the modules
the notebook imports (so that the per-cell time limit never pays for ``import torch``), then
hands over to ipykernel.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> None:
    spec_path, rest = sys.argv[1], sys.argv[2:]
    with open(spec_path) as f:
        spec = json.load(f)
    from . import limits

    limits.sandbox_self(spec["scratch"], spec.get("memory_bytes"), spec.get("file_bytes"),
                                  use_landlock=spec.get("landlock", True))
    for name in spec.get("preimport", []):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the notebook's own cell will report it
            pass
    limit_output(int(spec.get("max_output", 0)))
    sys.argv = ["ipykernel_launcher", *rest]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


class OutputLimitExceeded(KeyboardInterrupt):
    """Raised by print() once the notebook printed more than the grader's output limit."""


def limit_output(max_bytes: int) -> None:
    """Cap what the kernel sends as stdout/stderr: past ``max_bytes`` nothing more is sent (a
    flood never piles up in the runner), and in the cell that crossed the limit every write raises,
    so that a printing loop stops there."""
    if max_bytes <= 0:
        return
    from ipykernel import iostream

    original = iostream.OutStream.write
    sent, crossed_in = [0], [None]

    def write(self, string):
        if sent[0] > max_bytes:
            from IPython import get_ipython

            shell = get_ipython()
            count = shell.execution_count if shell is not None else None
            if crossed_in[0] is None:
                crossed_in[0] = count
            if count == crossed_in[0]:
                raise OutputLimitExceeded(f"the notebook printed more than {max_bytes / 2**20:g} MiB")
            return len(string)
        sent[0] += len(string)
        return original(self, string)

    iostream.OutStream.write = write


if __name__ == "__main__":
    main()

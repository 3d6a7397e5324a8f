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
    sys.argv = ["ipykernel_launcher", *rest]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()

"""``python -m course_utils.parallel`` and ``torchrun --nproc-per-node=N -m course_utils.parallel``:
a few DDP or FSDP training steps (``cli.main``)."""

import os

from .cli import main
from .launcher import leave_without_teardown

if __name__ == "__main__":  # not when a spawned rank imports this module as its __mp_main__
    code = main()
    if "RANK" in os.environ:  # a torchrun rank: its process group is gone, its lines printed
        leave_without_teardown(code)
    raise SystemExit(code)

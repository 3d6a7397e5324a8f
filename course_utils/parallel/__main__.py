"""``python -m course_utils.parallel`` and ``torchrun --nproc-per-node=N -m course_utils.parallel``:
a few DDP or FSDP training steps (``cli.main``)."""

from .cli import main

if __name__ == "__main__":  # not when a spawned rank imports this module as its __mp_main__
    raise SystemExit(main())

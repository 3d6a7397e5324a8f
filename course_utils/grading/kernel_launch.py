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
from pathlib import Path

from . import limits
from .runner import OUTPUT_NOTICE, output_size


def write_kernel_spec(scratch: Path, limits: dict) -> None:
    """Install the grader's kernel in ``scratch``: its limits (``scratch/kernel.json``, read by
    ``main``) and the Jupyter kernel spec ``course-grader`` the runner starts, found through
    ``JUPYTER_PATH=scratch/jupyter``."""
    (scratch / "kernel.json").write_text(json.dumps(limits))
    kdir = scratch / "jupyter" / "kernels" / "course-grader"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "course_utils.grading.kernel_launch", str(scratch / "kernel.json"),
                 "-f", "{connection_file}"],
        "display_name": "course grader", "language": "python", "interrupt_mode": "signal"}))


def main() -> None:
    """The kernel's entry point: limit this process as ``SPEC.json`` says, import the notebook's
    modules ahead, limit its output, then start ipykernel with the remaining arguments."""
    spec_path, rest = sys.argv[1], sys.argv[2:]
    with open(spec_path) as f:
        spec = json.load(f)

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
    """Raised in the cell whose output crossed the grader's output limit."""


def limit_output(max_bytes: int) -> None:
    """Cap what the kernel sends: ``max_bytes`` characters of stdout/stderr, displays and cell
    results together. The output that crosses the limit is cut there (a stream) or not sent (a
    display), and in the cell that crossed it that output and every later one raise
    ``OutputLimitExceeded``, so that a printing loop stops at once; in later cells output is
    dropped without a word.

    The kernel stops a flood itself, between two of the cell's own statements. An interrupt sent
    from outside when the flood's output reaches the runner can arrive after the cell has ended,
    while ipykernel sends the cell's reply: the reply is then lost and the runner waits for it until
    the cell's time limit kills the kernel (at load 13 on two cores, CI's class lost its flood cell
    that way). So the runner only counts, and interrupts a flood that got past this limit."""
    if max_bytes <= 0:
        return
    from ipykernel import displayhook, iostream, zmqshell

    state = {"sent": 0, "crossed_in": None}

    def this_cell():
        from IPython import get_ipython

        shell = get_ipython()
        return shell.execution_count if shell is not None else None

    def admit(size: int, stream=None, text: str = "") -> int:
        """How many of ``size`` characters may still be sent. The output that crosses the limit
        marks its cell and sends its allowed part of ``text`` (to ``stream``), then the notice."""
        if state["crossed_in"] is not None:
            return 0
        if state["sent"] + size <= max_bytes:
            state["sent"] += size
            return size
        state["crossed_in"], left, state["sent"] = this_cell(), max_bytes - state["sent"], max_bytes
        if stream is not None and left > 0:
            write(stream, text[:left])
        err = sys.stderr if isinstance(sys.stderr, iostream.OutStream) else stream
        if err is not None:  # the runner's sign of the stop (a redirected stderr: not sent)
            write(err, OUTPUT_NOTICE.format(mib=max_bytes / 2**20))
        return left

    def stop_if_crossed_here():
        if state["crossed_in"] is not None and this_cell() == state["crossed_in"]:
            raise OutputLimitExceeded(f"the notebook printed more than {max_bytes / 2**20:g} MiB")

    write = iostream.OutStream.write

    def limited_write(self, string):
        if not isinstance(string, str):
            return write(self, string)  # its own TypeError
        if admit(len(string), self, string) == len(string):
            return write(self, string)
        stop_if_crossed_here()
        return len(string)

    def limited_display(original):
        """``original`` (a display, a cell's result: a bundle first) sent only within the limit."""
        def send(self, data, *args, **kwargs):
            size = output_size(data)
            if admit(size) == size:
                return original(self, data, *args, **kwargs)
            stop_if_crossed_here()
            return None

        return send

    iostream.OutStream.write = limited_write
    zmqshell.ZMQDisplayPublisher.publish = limited_display(zmqshell.ZMQDisplayPublisher.publish)
    displayhook.ZMQShellDisplayHook.write_format_data = limited_display(
        displayhook.ZMQShellDisplayHook.write_format_data)


if __name__ == "__main__":
    main()

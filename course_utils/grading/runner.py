"""The runner: executes one submitted notebook top to bottom in a fresh, limited kernel and
reports what each code cell did. Its report never decides a score (the sandbox and the judge do);
it tells the teacher which cells raised, looped or killed the kernel.

``python -m course_utils.grading.runner SPEC.json`` (started by the grader in the submission's
scratch folder). It prints one JSON line on stdout. The kernel's own stdout and stderr go to
``kernel.log`` in the scratch folder (not to the teacher's terminal), its transport is IPC
sockets in the scratch folder where the system has them.

* a cell is interrupted after ``cell_timeout`` seconds (KeyboardInterrupt);
* a cell still running ``grace`` seconds later (a bare ``except:`` swallowed the interrupt) gets
  its kernel killed; the later cells are reported as not run;
* outputs are counted, never kept (a printing flood cannot fill the runner's memory); only
  errors are recorded. The kernel stops a flood itself at the output limit; the runner
  interrupts only one that got past it (at twice the limit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

CELL_TEXT = 2000  # characters of an error message kept per cell
#: what the kernel writes to stderr when the notebook's output reaches the limit (kernel_launch)
OUTPUT_NOTICE = "\n[the grader: this notebook printed more than {mib:g} MiB; no more output is sent]\n"
NOTICE_START = OUTPUT_NOTICE.split("{")[0]


def output_size(data: dict) -> int:
    """A display bundle's size, as the runner and the kernel's output limit both count it:
    characters, and bytes (an image, before the kernel encodes it) as the base64 text sent."""
    return sum(4 * ((len(v) + 2) // 3) if isinstance(v, (bytes, bytearray)) else len(str(v))
               for v in data.values())


def _make_client(nb, spec):
    from nbclient import NotebookClient
    from traitlets.config import Config

    cfg = Config()
    if spec.get("ipc_dir"):
        cfg.KernelManager.transport = "ipc"
        cfg.KernelManager.ip = os.path.join(spec["ipc_dir"], "kernel")

    class Client(NotebookClient):
        output_bytes = 0
        current: list = [None, 0.0]  # cell index, start time
        flooded: set = set()
        interrupted = False

        def output(self, outs, msg, display_id, cell_index):  # noqa: ARG002 - overrides NotebookClient.output
            content = msg.get("content", {})
            if msg["msg_type"] == "error":
                outs.append({"output_type": "error", "ename": str(content.get("ename", ""))[:200],
                             "evalue": str(content.get("evalue", ""))[:CELL_TEXT], "traceback": []})
                return None
            text = content.get("text", "") if msg["msg_type"] == "stream" else ""
            Client.output_bytes += len(text) if msg["msg_type"] == "stream" else output_size(content.get("data", {}))
            index = Client.current[0]
            if index is not None and (Client.output_bytes > spec["max_output"] or NOTICE_START in text):
                Client.flooded.add(index)
                # the kernel stops a flood itself at the limit (kernel_launch.limit_output); an
                # interrupt from here could land after the cell ended and lose its reply. Only a
                # flood past twice the limit (the kernel's limit undone) is interrupted from here
                if Client.output_bytes > 2 * spec["max_output"] and not Client.interrupted:
                    Client.interrupted = True
                    try:
                        os.kill(self.km.provisioner.process.pid, signal.SIGINT)
                    except Exception:  # noqa: BLE001 - the kernel is gone
                        pass
            return None

    client = Client(nb, timeout=spec["cell_timeout"], kernel_name="course-grader", allow_errors=True,
                    interrupt_on_timeout=True, record_timing=False, startup_timeout=spec.get("startup_timeout", 120),
                    iopub_timeout=5, resources={"metadata": {"path": spec["workdir"]}}, config=cfg)
    return client


def _exit_status(process) -> int | None:
    """The dead kernel's exit status, once the OS has it (up to 5 s)."""
    for _ in range(50):
        if process.poll() is not None:
            return process.returncode
        time.sleep(0.1)
    return None


def _cell_rows(nb, starts: dict[int, float], durations: dict[int, float], state: dict, died: int | None,
               flooded: set[int]) -> list[dict]:
    """One row per code cell: its number, prompt number, seconds and status (ok, error, timeout,
    flood, killed, died, not run, empty) with the error's name and value."""
    cells, number = [], 0
    finished = True
    # the prompt number JupyterLab shows when the notebook runs top to bottom: the cell's place
    # among the cells that started (a cell that killed the kernel may not have reported its own)
    order = {i: k + 1 for k, i in enumerate(sorted(starts, key=starts.get))}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        number += 1
        entry = {"index": i, "number": number, "execution_count": cell.get("execution_count") or order.get(i),
                 "seconds": round(durations.get(i, 0.0), 2)}
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if state["killed_cell"] == i:
            entry["status"] = "killed"
            finished = False
        elif died == i:
            entry["status"] = "died"
            finished = False
        elif not finished or i not in starts:
            entry["status"] = "not run" if cell.source.strip() else "empty"
        elif i in flooded or any(e["ename"] == "OutputLimitExceeded" for e in errors):
            entry["status"] = "flood"
        elif i in state["timed_out"]:
            entry["status"] = "timeout"
        elif errors:
            entry["status"] = "error"
        else:
            entry["status"] = "ok"
        if errors:
            entry["ename"], entry["evalue"] = errors[-1]["ename"], errors[-1]["evalue"]
        cells.append(entry)
    return cells


def run(spec: dict) -> dict:
    """Run the notebook of ``spec`` top to bottom in the grader's kernel: per code cell, its status
    and seconds; whether the kernel died (and its exit status) or never started."""
    import nbformat
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(spec["notebook"], as_version=4)
    client = _make_client(nb, spec)
    timeout, grace = spec["cell_timeout"], spec.get("grace", 5)
    state = {"killed_cell": None, "timed_out": set()}
    starts: dict[int, float] = {}
    durations: dict[int, float] = {}

    kernel_proc: list = []

    def on_start(cell, cell_index, **kw):  # noqa: ARG001 - nbclient's on_cell_execute(cell=, cell_index=)
        if not kernel_proc:
            try:
                kernel_proc.append(client.km.provisioner.process)
            except AttributeError:
                pass
        starts[cell_index] = time.monotonic()
        type(client).current = [cell_index, starts[cell_index]]
        sys.stdout.write(json.dumps({"start": cell_index}) + "\n")
        sys.stdout.flush()

    def on_done(cell, cell_index, **kw):  # noqa: ARG001 - nbclient's on_cell_executed(cell=, cell_index=, ...)
        durations[cell_index] = time.monotonic() - starts.get(cell_index, time.monotonic())
        type(client).current = [None, 0.0]

    client.on_cell_execute = on_start
    client.on_cell_executed = on_done
    stop = threading.Event()

    def watchdog():
        while not stop.wait(0.25):
            index, t0 = type(client).current
            if index is None:
                continue
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                state["timed_out"].add(index)
            if elapsed > timeout + grace and state["killed_cell"] is None:
                state["killed_cell"] = index
                try:
                    client.km.provisioner.process.kill()
                except Exception:  # noqa: BLE001 - already gone
                    pass

    t_start = time.monotonic()
    log = open(os.path.join(spec["scratch"], "kernel.log"), "wb")
    report: dict = {"died": None, "error": None}
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        client.execute(stdout=subprocess.DEVNULL, stderr=log, cwd=spec["workdir"])
    except DeadKernelError:
        report["died"] = type(client).current[0]
    except Exception as err:  # noqa: BLE001 - e.g. the kernel never started
        report["error"] = f"{type(err).__name__}: {str(err)[:CELL_TEXT]}"
    finally:
        stop.set()
        report["kernel_exit"] = _exit_status(kernel_proc[0]) if kernel_proc and report["died"] is not None else None
        if state["killed_cell"] is not None:
            report["died"] = None  # we killed it: reported as such
    cells = _cell_rows(nb, starts, durations, state, report["died"], type(client).flooded)
    first = min(starts.values(), default=None)
    report.update(cells=cells, output_bytes=type(client).output_bytes,
                  seconds={"kernel start": round(first - t_start, 1) if first else None,
                           "total": round(time.monotonic() - t_start, 1)})
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.grading.runner SPEC.json``: run the notebook, print the report as
    one JSON line, and exit at once (no interpreter teardown)."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    report = run(spec)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

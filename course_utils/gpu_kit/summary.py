"""``summary.md``: a run's ``kit.json`` for a reader -- what ran, what it found, what is left."""

from __future__ import annotations

from typing import Any

from ..checks import RecordError, guard
from ..markdown import table
from .budget import COMPLETE


def _diagnosis(name: str, res: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if "case" in res:
        head = f"predicted {res['predicted peak MiB']:,} MiB, peak in {res['predicted peak in']}"
        if "measured peak MiB" in res:
            head += (f"; measured {res['measured peak MiB']:,} MiB (miss {res['miss %']} %); the op-by-op step's "
                     f"peak {res.get('op-by-op peak - plain peak MiB', '-')} MiB from the plain step's")
        lines += [head + ".", ""]
        rows = []
        for label, s in res["settings"].items():
            if "error" in s:
                rows.append({"setting": label, "peak MiB": s["error"]})
                continue
            at = s.get("peak during", {})
            big = (s.get("largest transients") or [{}])[0]
            rows.append({"setting": label, "peak MiB": s["peak MiB"], "measured - predicted MiB": s.get("measured - predicted MiB"),
                         "peak during": f"{at.get('op', '-')} ({at.get('phase', '-')}), transient {at.get('transient MiB', '-')}",
                         "largest transient": f"{big.get('op', '-')} ({big.get('phase', '-')}) {big.get('transient MiB', '-')} MiB"
                         if big else "none"})
        lines += table(rows)
        if res.get("largest at the peak"):
            lines += ["Largest blocks live at the measured peak: " + "; ".join(res["largest at the peak"]), ""]
        cmp = res.get("outputs against the prediction")
        if cmp:
            more = "; ".join(f"{r['op']} ({r['phase']}, op {r['index']}) {r['measured MiB']} vs {r['predicted MiB']} MiB"
                             for r in cmp["ops whose outputs are larger"][:4]) or "none"
            lines += [f"Op by op against the prediction's own step ({cmp['ops matched']} ops matched; only measured: "
                      f"{', '.join(cmp['ops only measured']) or 'none'}; only predicted: "
                      f"{', '.join(cmp['ops only predicted']) or 'none'}): outputs larger by "
                      f"{cmp['outputs larger than predicted MiB']} MiB in all: {more}.", ""]
    elif "phases" in res:
        for label, rows in res["phases"].items():
            kept = ", ".join(f"{r['op']} ({r['phase']}) {r['kept MiB']} MiB" for r in rows) or "nothing"
            lines.append(f"- {label}: kept beyond outputs: {kept}")
        lines += [f"- CUBLAS_WORKSPACE_CONFIG {res['CUBLAS_WORKSPACE_CONFIG']}; CUBLASLT_WORKSPACE_SIZE "
                  f"{res['CUBLASLT_WORKSPACE_SIZE']}; {res['method']}", ""]
    else:
        lines += [f"- {k}: {v}" for k, v in res.items() if k != "op by op"]
        if "op by op" in res:
            big = res["op by op"].get("largest transients", [])[:3]
            lines.append("- largest transients: " + ("; ".join(f"{r['op']} ({r['phase']}) {r['transient MiB']} MiB"
                                                          for r in big) or "none"))
        lines.append("")
    return lines


def render(state: dict[str, Any]) -> str:
    """The whole summary of a run (``kit.json``'s content)."""
    m = state["machine"]
    tasks = state["tasks"]
    done = sum(t["status"] in COMPLETE for t in tasks)
    lines = [f"# GPU kit: {m['gpu']}", "",
             f"{m['date']}, torch {m['torch']} (CUDA {m['cuda']}, cuDNN {m.get('cudnn', '-')}), "
             f"{'DRY RUN on a CPU (tiny sizes, no CUDA readings)' if state['dry_run'] else 'measured'}; budget "
             f"{state['budget_s']:.0f} s, {state.get('elapsed_s', 0):.0f} s used; {done} of {len(tasks)} tasks done "
             f"or passed{'' if state.get('finished') else ' so far (the run had not ended when this was written)'}.",
             ""]
    if m.get("context MiB") is not None:
        lines += [f"CUDA context: {m['context MiB']} MiB (driver-used memory minus reserved, after a first "
                  "convolution).", ""]
    lines += ["| task | status | seconds | expected s | note |", "|---|---|---|---|---|"]
    for t in tasks:
        note = t.get("error", "").splitlines()[-1:] or [t["result"].get("summary", "") or t.get("note", "")]
        lines.append(f"| `{t['name']}` | {t['status']} | {t['seconds']} | {t['estimate_s']:g} | "
                     f"{str(note[0])[:160].replace('|', '/')} |")
    left = [t["name"] for t in tasks if t["status"] not in COMPLETE and t["status"] != "skipped (recorded)"]
    lines += ["", "Left for the next run (the kit resumes: it skips what a recorded run completed): "
              + (", ".join(f"`{n}`" for n in left) or "nothing") + ".", ""]
    by = {t["name"]: t for t in tasks}
    diag = [n for n in by if n.startswith("diagnose/") and by[n]["result"]]
    if diag:
        lines += ["## The diagnosis", ""]
        for n in diag:
            lines += _diagnosis(n, by[n]["result"])
    for n in [n for n in by if n.startswith("benchmark/") and by[n]["result"]]:
        res = by[n]["result"]
        lines += [f"## {n}", "", f"Largest miss {res.get('largest miss %', '-')} %; beyond 5 %: "
                  f"{', '.join(res.get('rows beyond 5 %', [])) or 'none'}.", ""] + table(res["table"])
    for n in [n for n in by if n.startswith("examples/") and by[n]["result"]]:
        lines += [f"## {n}", ""] + table(by[n]["result"].get("rows", []))
    nbs = [by[n] for n in by if n.startswith("notebook/") and by[n]["result"]]
    if nbs:
        lines += ["## Notebooks under nbval", ""]
        lines += table([{"notebook": t["result"].get("notebook"), "status": t["status"], "seconds": t["seconds"],
                          "cells run": t["result"].get("cells run"),
                          "failed code cells": ", ".join(str(c["code cell"]) for c in t["result"].get("failed cells", [])) or "none",
                          "note": t["result"].get("note", "")} for t in nbs])
    if state.get("left out of the archives"):
        lines += ["Left out of the archives (size limit): " + "; ".join(state["left out of the archives"]), ""]
    return "\n".join(lines) + "\n"


guard(globals(), RecordError)

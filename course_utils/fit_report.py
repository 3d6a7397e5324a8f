"""What ``fit`` found, as a report: ``Row`` (one technique), ``FitReport`` (the rows, the plain
step's prediction, the budget's lines, the loop), in words (``summary``), as tables (``table``,
six columns with short notes; ``show_table``: the table with its footnotes, the notes in full;
``by_module``), as drawings (``plot``, ``plot_frontier``) and as data (``to_dict``: the CLI's
``--json``). ``fit`` computes; this module only presents.
"""

from __future__ import annotations

import contextlib
import html
import math
from dataclasses import asdict, dataclass
from typing import Any

from .checkpointing import plot_breakdowns
from .checks import FitError, guard
from .cost import pareto
from .loops import Loop
from .memory import mib

BASELINE = "none (fp32)"
#: a note longer than this is cut at a "; " in ``table`` and given in full as a footnote (pandas'
#: default ``display.max_colwidth`` is 50: a note the table shows is never cut by the display)
NOTE_WIDTH = 50
GiB = 2**30


@dataclass
class Row:
    """One technique in ``fit``'s table: the predicted peak and what the card needs (bytes per GPU),
    whether it fits, the largest global batch and the estimated seconds per step."""

    technique: str
    peak: int  # predicted max_memory_allocated per GPU at the given batch
    breakdown: dict[str, int]  # MemTracker categories at the peak (per GPU)
    card_needs: int
    fits: bool
    largest_batch: int  # global batch
    seconds: float  # estimated per step at the given batch (nan: not estimated)
    note: str = ""
    verified: bool = True  # the largest batch was predicted to fit (and, for the plain step, b + 1 not to)
    gpus: int = 1  # ddp-N / fsdp-N: N (time is then the wall time of a step on N GPUs)
    after_forward: int = 0  # bytes allocated when the model's forward returns
    peak_location: tuple[str, str] = ("", "")  # (module, phase) of the peak; one-GPU rows only


def peak_where(prediction) -> tuple[str, str]:
    """``MemoryLog.peak_location`` with its phase "optimizer/other" called "optimizer"."""
    module, phase = prediction.log.peak_location
    return module, "optimizer" if phase.startswith("optimizer") else phase


@dataclass
class FitReport:
    """What ``fit`` found; ``summary()`` in words, ``table`` / ``by_module`` as DataFrames,
    ``to_dict()`` as data."""

    name: str
    input_shape: tuple[int, ...]
    card_gib: float
    prediction: Any  # memory.Prediction of the plain step
    spec: Any  # fit.StepSpec
    rows: list[Row]
    skipped: dict[str, str]
    by_module: Any  # pandas DataFrame
    usable: int  # bytes: the largest predicted peak the card holds
    overheads: Any  # budget.Overheads
    time_assumption: str
    blocks: list[tuple[str, int]]
    loop: Loop = Loop()
    workspace: str = ""  # the cuBLAS workspace line ('' when the step runs no matrix product)
    predictions: int = 0  # how many steps were predicted (fake-tensor runs), probe and counts excluded

    @property
    def parameters(self) -> int:
        return self.prediction.parameters

    @property
    def breakdown(self) -> dict[str, int]:
        """The plain step's peak by category (bytes): Parameter, Buffer, Gradient, Optstate,
        Activation, Temp (made in backward: the gradients of activations, backward's scratch), Other
        (the input and target), Total: MemTracker's names, as every breakdown of the course (and
        exercise 11) uses them."""
        return dict(self.prediction.breakdown)

    @property
    def allocated_after_forward(self) -> int:
        """Bytes allocated when the plain step's forward returns (parameters, optimizer state,
        kept gradients, what is saved for backward, the output): the figure papers and
        profilers report as "after the forward". With ``accumulate`` it is the second
        micro-batch's (the gradients and the previous micro-batch's output and loss alive), as
        for every later one; ``by_module`` counts the first micro-batch's forward."""
        return self.rows[0].after_forward

    @property
    def fits(self) -> bool:
        """Whether the plain step (the first row) fits the card: the CLI's exit code."""
        return self.rows[0].fits

    @property
    def peak_module(self) -> str:
        """The innermost module running at the peak, or "(loss)" / "(optimizer)" outside the model."""
        return peak_where(self.prediction)[0]

    @property
    def peak_phase(self) -> str:
        """"forward", "backward" or "optimizer" (the optimizer step and anything after backward)."""
        return peak_where(self.prediction)[1]

    def _ratio(self, r: Row) -> float:
        base = self.rows[0].seconds
        return round(r.seconds / base, 2) if base and not math.isnan(base) and not math.isnan(r.seconds) else math.nan

    def _notes(self) -> list[tuple[str, str]]:
        """Each row's note as the table shows it (at most ``NOTE_WIDTH`` characters) and its
        footnote ('' when the note fits): a longer note is cut after its last "; " that fits,
        marked [k], and given in full as footnote [k]."""
        out, k = [], 0
        for r in self.rows:
            if len(r.note) <= NOTE_WIDTH:
                out.append((r.note, ""))
                continue
            k += 1
            marker, head = f"[{k}]", ""
            for part in r.note.split("; "):
                if len(f"{head}; {part} ... [{k}]") > NOTE_WIDTH:
                    break
                head = f"{head}; {part}" if head else part
            head = head or r.note[:NOTE_WIDTH - len(marker) - 5].rstrip()
            out.append((f"{head} ... {marker}", f"{marker} {r.technique}: {r.note}"))
        return out

    @property
    def table(self):
        """One row per technique, six columns: technique, peak, card needs, largest batch, time,
        note (cut to ``NOTE_WIDTH``, with a footnote marker; ``footnotes`` has the notes in full)."""
        import pandas as pd

        return pd.DataFrame([{
            "technique": r.technique, "peak MiB": round(r.peak / 2**20, 1),
            "card needs GiB": round(r.card_needs / GiB, 2),
            f"largest batch in {self.card_gib:g} GiB": r.largest_batch,
            "time x baseline": self._ratio(r), "note": short} for r, (short, _) in zip(self.rows, self._notes(),
                                                                                       strict=True)])

    @property
    def footnotes(self) -> list[str]:
        """What goes under ``table``: which rows fit the card, then each cut note in full."""
        miss = [r.technique for r in self.rows if not r.fits]
        which = "every row" if not miss else "no row" if len(miss) == len(self.rows) else \
            "every row but " + ", ".join(miss)
        fits = f"fits the {self.card_gib:g} GiB card (card needs <= {self.card_gib:g} GiB): {which}"
        return [fits] + [note for _, note in self._notes() if note]

    def show_table(self) -> NotedTable:
        """``table`` with its ``footnotes`` under it: HTML in a notebook, text elsewhere."""
        return NotedTable(self.table, self.footnotes)

    def budget_lines(self) -> list[str]:
        """What the card holds besides the predicted peak, one line each."""
        o = self.overheads
        holds = (f"holds a predicted peak of {mib(self.usable):,.0f} MiB:" if self.usable > 0 else
                 "holds no step: what it needs besides the peak takes it all:")
        lines = [f"card: {self.card_gib:g} GiB {holds}",
                 f"  less the CUDA context {o.context_mib:,.0f} MiB and a slack of {o.slack:.0%} of the peak "
                 f"({o.source})"]
        if self.workspace:
            lines.append(f"  less {self.workspace}")
        return lines

    def summary(self) -> str:
        """The report in words: the plain step, where its peak is, the budget, the techniques."""
        b, p = self.breakdown, self.prediction
        lines = [f"{self.name}: input {tuple(self.input_shape)}, {self.parameters:,} parameters, "
                 f"loss {self.spec.loss_name} -> output {self.spec.output_shape}",
                 f"loop: {self.loop.describe()}",
                 f"baseline: {p.method}",
                 f"  peak {mib(p.peak):,.1f} MiB = " + ", ".join(
                     f"{k} {mib(v):,.1f}" for k, v in b.items() if k != "Total" and v),
                 f"  allocated after the forward: {mib(self.allocated_after_forward):,.1f} MiB",
                 f"  the peak is in {self.peak_module} ({self.peak_phase})",
                 *self.budget_lines(), ""]
        if self.loop.mode != "inference":
            lines += ["saved for backward, by top-level module:"]
            lines += ["  " + s for s in self.by_module.to_string(index=False).splitlines()] + [""]
        lines += [f"techniques (one at a time on the fp32 step; {self.time_assumption}):"]
        lines += ["  " + s for s in repr(self.show_table()).splitlines()]
        if self.skipped:
            lines += ["", "not applicable:"] + [f"  {k}: {v}" for k, v in self.skipped.items()]
        if not math.isnan(self.rows[0].seconds):
            lines += ["", "memory-time frontier on one GPU (no other one-GPU row is both smaller and faster):"]
            for r, front in zip(self.rows, self._front(), strict=True):
                if front:
                    lines.append(f"  {r.technique}: card needs {r.card_needs / GiB:.2f} GiB, time x{self._ratio(r):.2f}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Every figure of the report, with its method and assumptions: the CLI's ``--json``."""
        o = self.overheads
        return {
            "model": self.name, "input_shape": list(self.input_shape), "parameters": self.parameters,
            "loss": self.spec.loss_name, "output_shape": list(self.spec.output_shape),
            "loop": {**asdict(self.loop),
                     "optimizer": self.loop.optimizer_name, "described": self.loop.describe()},
            "method": self.prediction.method, "card_gib": self.card_gib, "fits": self.fits,
            "peak_bytes": self.prediction.peak, "breakdown_bytes": self.breakdown,
            "allocated_after_forward_bytes": self.allocated_after_forward,
            "peak_location": {"module": self.peak_module, "phase": self.peak_phase},
            "budget": {"usable_bytes": int(self.usable), "context_mib": o.context_mib, "slack": o.slack,
                       "workspace_bytes": o.workspace_bytes, "source": o.source, "workspace": self.workspace},
            "time_assumption": self.time_assumption, "predictions": self.predictions,
            "rows": [{"technique": r.technique, "peak_bytes": r.peak, "card_needs_bytes": r.card_needs,
                      "fits": r.fits, "largest_batch": r.largest_batch, "largest_batch_verified": r.verified,
                      "time_x_baseline": None if math.isnan(self._ratio(r)) else self._ratio(r),
                      "gpus": r.gpus, "note": r.note, "breakdown_bytes": dict(r.breakdown),
                      "peak_location": dict(zip(("module", "phase"), r.peak_location, strict=True)),
                      "allocated_after_forward_bytes": r.after_forward} for r in self.rows],
            "not_applicable": dict(self.skipped),
        }

    def _front(self) -> list[bool]:
        one = [r for r in self.rows if r.gpus == 1]
        front = dict(zip((r.technique for r in one), pareto([(r.seconds, r.card_needs) for r in one]), strict=True))
        return [front.get(r.technique, False) for r in self.rows]

    def plot(self, ax=None):
        """Stacked bars per technique (per GPU at the peak), the card's usable line."""
        ax = plot_breakdowns({r.technique: r.breakdown for r in self.rows}, ax=ax,
                             title=f"{self.name}, batch {self.input_shape[0]}: predicted peak per GPU",
                             budget_mib=self.usable / 2**20,
                             budget_label=f"{self.card_gib:g} GiB card: usable (context + slack off)")
        return ax

    def plot_frontier(self, ax=None):
        """Card needs against estimated time per step (x baseline, log scale), each technique a
        marker of its own in the legend (rows at the same point share one: "a = b"), the Pareto
        front of the one-GPU techniques joined (ddp-N / fsdp-N, triangles, spend N GPUs: not on
        the same footing). The memory axis fits the points; the card's line is drawn where it
        falls inside it, and said in the title where it does not."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4))
        groups: dict[tuple[float, float], list[tuple[Row, bool]]] = {}
        for r, f in zip(self.rows, self._front(), strict=True):
            groups.setdefault((self._ratio(r), round(r.card_needs / GiB, 3)), []).append((r, f))
        for i, ((t, m), group) in enumerate(groups.items()):
            front = any(f for _, f in group)
            ax.scatter(t, m, color=f"C{i % 10}", marker="o" if group[0][0].gpus == 1 else "^", s=60, zorder=3,
                       edgecolors="black" if front else "none",
                       label=" = ".join(r.technique for r, _ in group) + (" (front)" if front else ""))
        fp = sorted((t, m) for (t, m), group in groups.items() if any(f for _, f in group))
        ax.plot([t for t, _ in fp], [m for _, m in fp], "--", color="grey", zorder=2, label="Pareto front (one GPU)")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}" if round(v, 6) in (0.2, 0.3, 0.5, 2, 3, 5) else ""))
        lo, hi = frontier_limits([m for _, m in groups])
        ax.set_ylim(lo, hi)
        title = "memory-time frontier"
        if lo <= self.card_gib <= hi:
            ax.axhline(self.card_gib, color="black", lw=1, ls=":", label=f"{self.card_gib:g} GiB card")
        else:
            title += f" ({self.card_gib:g} GiB card: {'above' if self.card_gib > hi else 'below'} this axis)"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("estimated time per step / baseline, log scale (" + self.time_assumption.split(":")[0] + ")")
        ax.set_ylabel("card needs, GiB per GPU (predicted)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        return ax


def frontier_limits(values: list[float]) -> tuple[float, float]:
    """The memory axis of ``plot_frontier``: the points' range with 15 % of it (at least 0.05 GiB)
    on each side, never below 0."""
    lo, hi = min(values), max(values)
    pad = max(0.15 * (hi - lo), 0.05)
    return max(0.0, lo - pad), hi + pad


class NotedTable:
    """A table with footnotes under it (``FitReport.show_table``): HTML in a notebook (the notes
    as a paragraph under the table), text elsewhere (``repr``); ``frame`` is the DataFrame."""

    def __init__(self, frame: Any, notes: list[str]):
        self.frame, self.notes = frame, notes

    def _repr_html_(self) -> str:
        notes = "<br>".join(html.escape(n) for n in self.notes)
        return f"{self.frame.to_html(index=False)}<p style='font-size: 90%'>{notes}</p>"

    def __repr__(self) -> str:
        with pandas_wide():
            return "\n".join([self.frame.to_string(index=False), *self.notes])


@contextlib.contextmanager
def pandas_wide():
    """pandas options wide enough that the report's table is never cut."""
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 200):
        yield


def by_module(prediction) -> Any:
    """Saved-for-backward bytes each top-level module adds during its (first) forward (the
    saved-tensor meter, each storage counted once, at the first module that saves it)."""
    import pandas as pd

    rows = prediction.log.rows
    start: dict[int, int] = {}
    out: dict[str, int] = {}
    root = None
    for r in rows:
        if r.hook == "pre":
            start[r.call] = r.saved
        elif r.hook == "fwd" and r.call in start:
            delta = r.saved - start.pop(r.call)
            if r.call == 0:  # the root's forward returned: the first micro-batch's forward is complete
                root = delta
                break
            if "." not in r.module:
                out[r.module] = out.get(r.module, 0) + delta
    total = root if root is not None else sum(out.values())
    rest = total - sum(out.values())
    if rest > 0:
        out["(the root's own forward)"] = rest
    return pd.DataFrame([{"module": k, "saved MiB": round(v / 2**20, 2), "share %": round(100 * v / total, 1)
                          if total else 0.0, "saved bytes": v} for k, v in out.items()])


guard(globals(), FitError, skip=("seconds",))  # seconds: nan where time is not estimated

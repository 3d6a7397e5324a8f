"""course_utils.parallel_plots: the drawings of notebooks 08 and 09 show the figures they are given."""

import matplotlib
import pytest

from course_utils.parallel_plots import plot_memory_timeline

matplotlib.use("Agg")


def test_memory_timeline_stacks_each_moment_to_its_total():
    """Notebook 08's time line rests on this: each column's top is its moment's total, in time
    order, the resting level drawn at the first moment's total."""
    import matplotlib.pyplot as plt

    mib = 2**20
    moments = [("at rest", {"params": 2 * mib, "optimizer": 4 * mib}),
               ("F a", {"params": 2 * mib, "gathered params": 8 * mib, "all-gather buffer": 8 * mib}),
               ("B a", {"params": 2 * mib, "unsharded grads": 8 * mib, "prefetched params": 1 * mib})]
    fig, ax = plt.subplots()
    plot_memory_timeline(moments, ax=ax, phases=[("forward", 1, 1), ("backward", 2, 2)])
    tops = {}
    for bar in ax.patches:
        if bar.get_width() < 1:  # the columns (the phases' spans are a unit wide)
            x = round(bar.get_x() + bar.get_width() / 2)
            tops[x] = max(tops.get(x, 0), bar.get_y() + bar.get_height())
    assert tops == {0: pytest.approx(6), 1: pytest.approx(18), 2: pytest.approx(11)}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["at rest", "F a", "B a"]
    assert ax.get_ylabel() == "MiB" and ax.lines[0].get_ydata()[0] == pytest.approx(6)
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one moment"):
        plot_memory_timeline([])

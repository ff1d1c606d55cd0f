"""The acceptance-distribution plot of a mining run: one density curve per slice (matplotlib, Agg).

Draws from the per-slice histograms in `draftwheel.mining.stats.SliceStats`; reads no logs, returns nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from draftwheel.mining.stats import BINS, SliceStats
from draftwheel.serving.engine.acceptance import acceptance_rate


def plot_acceptance(stats: dict[str, SliceStats], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    centers = (np.arange(BINS) + 0.5) / BINS
    for name in sorted(stats):
        hist = stats[name].rate_hist
        if hist.sum() == 0:
            continue
        rate = acceptance_rate(stats[name].accepted, stats[name].drafted)
        ax.step(centers, hist / hist.sum(), where="mid", label=f"{name} (n={int(hist.sum())}, rate={rate:.2f})")
    ax.set_xlabel("per-request acceptance rate (accepted / drafted tokens)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Acceptance distribution per slice")
    ax.set_xlim(0, 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

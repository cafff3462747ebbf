"""Line plots as PNG bytes for the run report and the runs comparison, rendered in memory (Agg canvas, no
pyplot global state: safe in threads).

    png = line_plot({"loss": (steps, losses)}, "Training loss", "step", "loss", references={"eval loss": 5.4})
"""

from __future__ import annotations

import io

Series = tuple[list[float], list[float]]


def line_plot(
    series: dict[str, Series],
    title: str,
    xlabel: str,
    ylabel: str,
    references: dict[str, float] | None = None,
    right: tuple[str, dict[str, Series]] | None = None,
    spans: dict[str, tuple[float, float]] | None = None,
) -> bytes:
    """One line per series, dashed horizontal lines for `references`, `right`'s (label, series) on a second
    y axis, `spans` shaded (e.g. schedule_phases)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (label, (xs, ys)) in enumerate(series.items()):
        marker = ("." if len(xs) < 30 else None) if i == 0 else "o"
        ax.plot(xs, ys, marker=marker, markersize=3 if i else 6, linewidth=1.2, color=f"C{i}", label=label)
    for i, (label, value) in enumerate((references or {}).items()):
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{i + len(series)}", label=label)
    for (label, (start, end)), gray in zip((spans or {}).items(), ("0.9", "0.97", "0.82"), strict=False):
        ax.axvspan(start, end, color=gray, label=label, zorder=0)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if right:
        twin = ax.twinx()
        for i, (label, (xs, ys)) in enumerate(right[1].items(), start=len(series) + len(references or {})):
            twin.plot(xs, ys, linewidth=0.8, color=f"C{i}", label=label)
        twin.set_ylabel(right[0])
        fig.legend(fontsize="small", loc="upper right")
    elif references or spans or len(series) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def schedule_phases(steps: list[float], lrs: list[float]) -> dict[str, tuple[float, float]]:
    """Warmup, stable (the rate at its peak) and decay, those that last a step at least."""
    if len(lrs) < 2:
        return {}
    peak = max(lrs)
    held = [step for step, lr in zip(steps, lrs, strict=True) if lr >= peak * (1 - 1e-6)]
    phases = {"warmup": (steps[0], held[0]), "stable": (held[0], held[-1]), "decay": (held[-1], steps[-1])}
    return {name: span for name, span in phases.items() if span[1] > span[0]}

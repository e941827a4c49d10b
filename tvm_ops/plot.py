"""`bench --plot`: the bench lines as a picture (matplotlib, the optional extra `plot`).

One row of bars per case: our time and each PyTorch peer's on a log axis, with the io
efficiency written beside ours.
"""

from __future__ import annotations

from pathlib import Path


def require() -> None:
    """NotSupportedError naming the extra when matplotlib is missing (checked before a bench runs)."""
    import importlib.util

    from .errors import NotSupportedError

    if importlib.util.find_spec("matplotlib") is None:
        raise NotSupportedError("bench --plot needs matplotlib: pip install 'tvm_ops[plot]'")


def bench_lines(lines: list, target: str, path: Path) -> None:
    """Draw `lines` (bench.BenchLine) into the PNG file `path`."""
    require()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = []  # (y, label, ms, is ours, case index): one bar per measured time
    y, ticks = 0.0, []
    for line in lines:
        peers = ({line.peer or "torch": line.peer_ms} if line.peer_ms is not None else {}) | line.other_peers
        bars = [("tvm_ops", line.median_ms, True)] + [(name, ms, False) for name, ms in peers.items()]
        ticks.append((y + (len(bars) - 1) / 2, f"{line.op}\n{line.case} {line.dtype}"))
        for name, ms, ours in bars:
            label = (f" {ms:.3g} ms, io {line.io_efficiency:.0%}" if ours
                     else f" {name} {ms:.3g} ms (x{ms / line.median_ms:.1f})")
            rows.append((y, label, ms, ours))
            y += 1
        y += 0.8  # a gap between cases
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.17 * y))
    ax.barh([r[0] for r in rows], [r[2] for r in rows], 0.8,
            color=["tab:blue" if r[3] else "tab:gray" for r in rows])
    for row_y, label, ms, _ in rows:
        ax.annotate(label, (ms, row_y), va="center", fontsize=6)
    ax.set_xscale("log")
    ax.set_yticks([tick for tick, _ in ticks], [label for _, label in ticks], fontsize=6)
    ax.set_ylim(y, -1)
    ax.set_xlabel("median time per call, ms (log scale); blue: tvm_ops, grey: PyTorch formulations")
    ax.set_title(f"tvm_ops bench on {target}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

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

    series = {"tvm_ops": [line.median_ms for line in lines]}
    for i, line in enumerate(lines):
        peers = ({line.peer or "torch": line.peer_ms} if line.peer_ms is not None else {}) | line.other_peers
        for name, ms in peers.items():
            series.setdefault(name, [None] * len(lines))[i] = ms
    labels = [f"{line.op}\n{line.case} {line.dtype}" for line in lines]
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * len(lines) * max(1, len(series) / 2)))
    for k, (name, values) in enumerate(series.items()):
        rows = [i for i, v in enumerate(values) if v]
        ax.barh([i + k * height for i in rows], [values[i] for i in rows], height, label=name)
    for i, line in enumerate(lines):
        ax.annotate(f" {line.median_ms:.3g} ms, io {line.io_efficiency:.0%}", (line.median_ms, i),
                    va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(lines))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median time per call, ms (log scale)")
    ax.set_title(f"tvm_ops bench on {target}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

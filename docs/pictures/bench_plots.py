"""Plots of the recorded benchmark results, drawn from the tables in the docs (the record, each with the command
that measured it), so a re-run recorded there is one `python docs/pictures/bench_plots.py` away from its picture:

    client-scaling.png   bench/client_scaling.py: batches/s against servers, beside perfect scaling (docs/client.md)
    encodings.png        bench/wire_throughput.py: bytes per token and tokens/s per encoding (docs/server.md)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def table(doc: Path, header: str) -> list[list[str]]:
    """The rows of the first Markdown table in ``doc`` whose header row starts with ``header``."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("*`") for cell in line.strip("|").split("|")])
    return rows


def save(fig, path: Path, rows: list[list[str]]) -> Path:
    """Save with the table rows drawn as the PNG's "Data" text, so a test can tell a stale picture from its
    numbers even where another matplotlib draws other pixels."""
    fig.savefig(path, metadata={"Data": json.dumps(rows)})
    plt.close(fig)
    return path


def number(text: str) -> float:
    return float(re.sub(r"[^\d.]", "", text))


def client_scaling(out: Path) -> Path:
    rows = table(ROOT / "docs" / "client.md", "| N | batches/s | ratio |")
    servers = [int(r[0]) for r in rows]
    measured = [number(r[1]) for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    ax.plot(
        servers, [measured[0] * n for n in servers], "--", color="#9aa5b8", label="perfect: N x one server"
    )
    ax.plot(servers, measured, "o-", color="#3465a4", label="measured")
    for n, value, row in zip(servers, measured, rows, strict=True):
        ax.annotate(
            f"{value:.1f}  (ratio {row[2]})",
            (n, value),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    ax.set(
        xlabel="target servers (N)",
        ylabel="batches/s",
        xticks=servers,
        title="Client scaling (50 ms synthetic forward)",
    )
    ax.set_xlim(0.7, max(servers) * 1.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, out / "client-scaling.png", rows)


def encodings(out: Path) -> Path:
    rows = [
        r
        for r in table(ROOT / "docs" / "server.md", "| run | shape | encoding | bytes/token |")
        if r[2] != "raw TCP"
    ]
    names = list(dict.fromkeys(r[2] for r in rows))
    runs = list(dict.fromkeys(r[0] for r in rows))
    size = {r[2]: number(r[3]) for r in rows}
    speedup = {(r[0], r[2]): number(r[5]) for r in rows}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    colors = ["#9aa5b8", "#3465a4", "#4e9a06"]
    left.bar(names, [size[n] / 1000 for n in names], color=colors)
    for i, n in enumerate(names):
        left.text(i, size[n] / 1000, f"{size[n] / size[names[0]]:.0%}", ha="center", va="bottom", fontsize=8)
    left.set(ylabel="KB per token", title="Reply size at the Llama-3.1-8B shape")
    width = 0.8 / len(runs)
    shades = ["#c9d3e3", "#8fa7cc", "#3465a4"]
    for j, run in enumerate(runs):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(names))]
        values = [speedup[run, n] for n in names]
        right.bar(xs, values, width, label=f"run {run}", color=shades[j % len(shades)])
        for x, value in zip(xs, values, strict=True):
            right.text(x, value, f"{value:.2f}", ha="center", va="bottom", fontsize=6)
    right.axhline(1, color="black", linewidth=0.6)
    right.set(
        xticks=range(len(names)),
        xticklabels=names,
        ylabel="tokens/s, x nemo",
        title="Transfer speed vs nemo (same run)",
    )
    right.legend(fontsize=8)
    for axis in (left, right):
        axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save(fig, out / "encodings.png", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=HERE, help="directory for the PNGs (default: docs/pictures)"
    )
    args = parser.parse_args()
    for path in (client_scaling(args.out), encodings(args.out)):
        print(path)


if __name__ == "__main__":
    main()

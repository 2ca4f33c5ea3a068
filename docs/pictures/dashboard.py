"""A picture of the chart's Grafana dashboard drawn from real data: two real target servers (the embedded model)
under `eagle3-target bench` load plus a burst of malformed requests, scraped every second by a real Prometheus
(Debian's `prometheus`); every panel's own queries are evaluated there over the run and drawn with matplotlib in
the dashboard's layout. No Grafana is involved, so the look is matplotlib's, the numbers are the dashboard's.

    python docs/pictures/dashboard.py          # about a minute and a half; writes docs/pictures/dashboard.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's real-Prometheus and server-process helpers
from chart.prometheus_support import Prometheus, running_prometheus  # noqa: E402
from target_support import TargetProcess  # noqa: E402

DASHBOARD = json.loads((ROOT / "charts" / "eagle3-target" / "dashboards" / "eagle3-target.json").read_text())
VARIABLES = {"$namespace": ".*", "$pod": ".*", "$__rate_interval": "4s"}  # Grafana's: 4 scrape intervals
STEP = 2.0  # seconds between points


def expr_of(target: dict) -> str:
    expr = target["expr"]
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def load(urls: list[str], seconds: float) -> float:
    """bench on one server, then on both (each phase ``seconds`` long), then 40 malformed /generate bodies
    (the error panels' 400s); returns a moment in the middle of the two-server phase, for the stat panels."""
    bench = [sys.executable, "-m", "eagle3_target.cli", "--log-level", "WARNING", "bench", "--seq-len", "512"]
    bench += ["--draft-vocab", "128", "--warmup", "1", "--batches", "1000000"]
    middle = 0.0
    for spec in (urls[0], ",".join(urls)):
        unbuffered = {**os.environ, "PYTHONUNBUFFERED": "1"}
        running = subprocess.Popen([*bench, spec], stdout=subprocess.PIPE, env=unbuffered, text=True)
        running.stdout.readline()  # "N servers, model ...": the load starts now
        middle = time.time() + seconds / 2
        time.sleep(seconds)
        running.send_signal(signal.SIGINT)  # Ctrl-C: the CLI ends the run quietly
        running.wait(timeout=60)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(40):
        request = urllib.request.Request(f"{urls[1]}/generate", data=b"not a wire blob", method="POST")
        with contextlib.suppress(OSError):  # 400 with {"error", "detail"}: what the error panels show
            opener.open(request, timeout=5)
        time.sleep(0.1)
    return middle


def human(value: float, unit: str | None) -> str:
    if unit == "percentunit":
        return f"{value:.1%}"
    if unit == "Bps":
        for scale, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B/s"
    suffix = {"reqps": " req/s", "s": " s"}.get(unit or "", "")
    return f"{value:,.3g}{suffix}"


def legend_name(metric: dict) -> str:
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"


def draw_timeseries(ax, prometheus: Prometheus, panel: dict, start: float, end: float) -> None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    for target in panel["targets"]:
        data = prometheus.api("query_range", query=expr_of(target), start=start, end=end, step=STEP)
        for series in data["result"]:
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            ax.plot(xs, ys, linewidth=1.2, label=legend_name(series["metric"]))
    ax.set_xlim(0, end - start)
    ax.tick_params(labelsize=6)
    ax.set_xlabel("seconds into the run", fontsize=6)
    if unit:
        ax.set_ylabel(unit, fontsize=6)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=5, loc="upper left")


def draw_instant(ax, prometheus: Prometheus, panel: dict, at: float) -> None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    results = [prometheus.api("query", query=expr_of(t), time=at)["result"] for t in panel["targets"]]
    ax.set_axis_off()
    if panel["type"] == "stat":
        values = [human(float(r[0]["value"][1]), unit) if r else "no data" for r in results]
        ax.text(0.5, 0.45, " / ".join(values), ha="center", va="center", fontsize=16, color="#2f6f2f")
    elif panel["type"] == "bargauge":
        rows = sorted(((legend_name(s["metric"]), float(s["value"][1])) for s in results[0]), reverse=True)
        ax.set_axis_on()
        ax.barh([name for name, _ in rows], [value for _, value in rows], color="#3465a4")
        ax.tick_params(labelsize=6)
        ax.set_xlabel(unit or "", fontsize=6)
    else:  # table: one line per series, its labels
        lines = [legend_name(s["metric"]) for r in results for s in r]
        ax.text(0.01, 0.95, "\n".join(lines), va="top", fontsize=5.5, family="monospace", wrap=True)


def draw(prometheus: Prometheus, start: float, end: float, at: float, out: Path) -> None:
    """The dashboard's layout; graphs over [start, end], single values (stat, gauge, table) at ``at``."""
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in DASHBOARD["panels"])
    fig = plt.figure(figsize=(16, height * 0.36), dpi=100)
    grid = fig.add_gridspec(height, 24, hspace=0.0, wspace=0.0)
    for panel in DASHBOARD["panels"]:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]])
        if panel["type"] == "row":
            ax.set_axis_off()
            ax.text(0, 0.5, panel["title"], fontsize=11, weight="bold", va="center")
            continue
        if panel["type"] == "timeseries":
            draw_timeseries(ax, prometheus, panel, start, end)
        else:
            draw_instant(ax, prometheus, panel, at)
        ax.set_title(panel["title"], fontsize=8, loc="left")
    title = (
        f"{DASHBOARD['title']} dashboard: 2 target servers (embedded model), bench load, then 40 bad requests"
    )
    fig.suptitle(f"{title}; single values at {at - start:.0f} s", y=0.995)
    fig.subplots_adjust(left=0.04, right=0.99, top=0.97, bottom=0.02)
    for ax in fig.axes:  # gaps between panels, as Grafana leaves them
        box = ax.get_position()
        ax.set_position([box.x0 + 0.012, box.y0 + 0.006, box.width - 0.018, box.height - 0.014])
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    # The benches stop on Ctrl-C. A SIGINT ignored by whoever started us (a test runner may leave it so)
    # would be ignored by them too, as an ignored signal survives exec: they would run on past the picture.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("dashboard.png"))
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each load phase")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    servers = [TargetProcess(host) for host in ("127.0.0.2", "127.0.0.3")]
    try:
        for server in servers:
            server.wait_ready()
        targets = [
            (
                server.url.removeprefix("http://"),
                {"namespace": "trainers", "pod": f"llama-{i}", "container": "server"},
            )
            for i, server in enumerate(servers)
        ]
        with tempfile.TemporaryDirectory() as work, running_prometheus(Path(work), targets) as prometheus:
            prometheus.wait_for("eagle3_target_ready")
            start = time.time()
            time.sleep(5)
            at = load([s.url for s in servers], args.seconds)
            time.sleep(8)  # the last scrapes and rate windows
            draw(prometheus, start, time.time(), at, args.out)
    finally:
        for server in servers:
            server.kill()
    print(args.out)


if __name__ == "__main__":
    main()

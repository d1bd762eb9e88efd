"""Training statistics of distributed fits and their self-contained HTML report.

Times are wall-clock milliseconds from the system clock of the machine that recorded them (no NTP
correction): timelines of different machines are only as aligned as their clocks.
"""

from __future__ import annotations

import html
import math
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkgrad._io import write_text

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


@dataclass
class EventStats:
    """One timed activity: where it ran, when it started (epoch ms) and how long it took."""

    machine: str
    process: int
    thread: int
    start_ms: float
    duration_ms: float
    extra: dict[str, float] = field(default_factory=dict)


def now_ms() -> float:
    """System wall clock in milliseconds."""
    return time.time() * 1000.0


def event(start_ms: float, **extra: float) -> EventStats:
    """An event that started at ``start_ms`` and ends now, recorded for this machine/process/thread."""
    return EventStats(
        socket.gethostname(),
        os.getpid(),
        threading.get_ident() & 0xFFFFFFFF,
        start_ms,
        now_ms() - start_ms,
        dict(extra),
    )


class Timer:
    """``with stats.timer("Key"):`` records one event under ``Key`` (no-op when ``stats`` is None)."""

    def __init__(self, stats: SparkTrainingStats | None, key: str, **extra: float) -> None:
        self._stats, self._key, self._extra = stats, key, extra

    def __enter__(self) -> Timer:
        self._start = now_ms()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stats is not None:
            self._stats.add(self._key, event(self._start, **self._extra))


class SparkTrainingStats:
    """Events per key (phase timings of the driver and the workers), per-worker iteration series, the
    training score per iteration, metrics per epoch and counters.

    Series (gradient sharing): for each worker, one record per iteration with ``iteration``,
    ``threshold``, ``density`` (encoded fraction of the vector), ``bytes_sent`` and ``time_ms``.
    Scores: for each source (a worker, or ``"average"`` of an averaging round), ``(iteration, score)``
    pairs. Epoch metrics: per epoch, e.g. ``accuracy`` and ``score`` on the evaluation data.
    """

    def __init__(self) -> None:
        self._events: dict[str, list[EventStats]] = {}
        self._series: dict[str, list[dict[str, float]]] = {}
        self._scores: dict[str, list[tuple[float, float]]] = {}
        self._epochs: dict[int, dict[str, float]] = {}
        self.counters: dict[str, float] = {}

    # -- recording ------------------------------------------------------------------------------
    def add(self, key: str, ev: EventStats) -> None:
        """Record one event under ``key``."""
        self._events.setdefault(key, []).append(ev)

    def timer(self, key: str, **extra: float) -> Timer:
        """Context manager timing one event under ``key``."""
        return Timer(self, key, **extra)

    def add_series(self, worker: str, record: dict[str, float]) -> None:
        """Append one per-iteration record for ``worker``."""
        self._series.setdefault(worker, []).append(record)

    def add_score(self, source: str, iteration: float, score: float) -> None:
        """Record the training score (loss) ``source`` had at ``iteration``."""
        self._scores.setdefault(source, []).append((float(iteration), float(score)))

    def add_epoch_metrics(self, epoch: int, **metrics: float) -> None:
        """Record metrics of ``epoch`` (network numbering), e.g. ``accuracy=0.93``."""
        self._epochs.setdefault(int(epoch), {}).update({k: float(v) for k, v in metrics.items()})

    def count(self, name: str, amount: float) -> None:
        """Add ``amount`` to the counter ``name``."""
        self.counters[name] = self.counters.get(name, 0.0) + amount

    def merge(self, other: SparkTrainingStats) -> SparkTrainingStats:
        """Add everything ``other`` recorded to this object; returns self."""
        for key, evs in other._events.items():
            self._events.setdefault(key, []).extend(evs)
        for worker, recs in other._series.items():
            self._series.setdefault(worker, []).extend(recs)
        for source, pairs in other._scores.items():
            self._scores.setdefault(source, []).extend(pairs)
        for epoch, metrics in other._epochs.items():
            self._epochs.setdefault(epoch, {}).update(metrics)
        for name, value in other.counters.items():
            self.count(name, value)
        return self

    # -- reading --------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Event keys in first-recorded order."""
        return list(self._events)

    def events(self, key: str) -> list[EventStats]:
        """The events of ``key`` sorted by start time."""
        if key not in self._events:
            raise KeyError(f"no training stats under {key!r}; keys: {', '.join(self.keys())}")
        return sorted(self._events[key], key=lambda e: e.start_ms)

    def series(self) -> dict[str, list[dict[str, float]]]:
        """Per-worker iteration records (gradient sharing only), each sorted by iteration."""
        return {w: sorted(r, key=lambda x: x["iteration"]) for w, r in sorted(self._series.items())}

    def scores(self) -> dict[str, list[tuple[float, float]]]:
        """Training score per iteration: source -> ``(iteration, score)`` pairs sorted by iteration."""
        return {k: sorted(v) for k, v in sorted(self._scores.items())}

    def epoch_metrics(self) -> dict[int, dict[str, float]]:
        """Metrics per epoch (network numbering), in epoch order."""
        return {e: dict(m) for e, m in sorted(self._epochs.items())}

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable)."""
        return {
            "events": {k: [asdict(e) for e in self.events(k)] for k in self.keys()},
            "series": self.series(),
            "scores": {k: [list(p) for p in v] for k, v in self.scores().items()},
            "epochs": {str(e): m for e, m in self.epoch_metrics().items()},
            "counters": dict(self.counters),
        }

    def summary(self) -> str:
        """A text table: count, mean, min, max and total duration per key, then the counters."""
        lines = [
            f"{'key':55s} {'count':>7s} {'mean ms':>10s} {'min ms':>10s} {'max ms':>10s} {'total ms':>12s}"
        ]
        for key in self.keys():
            d = [e.duration_ms for e in self._events[key]]
            lines.append(
                f"{key:55s} {len(d):7d} {sum(d) / len(d):10.2f} {min(d):10.2f} {max(d):10.2f} {sum(d):12.1f}"
            )
        for name, value in sorted(self.counters.items()):
            lines.append(f"{name:55s} {value:g}")
        return "\n".join(lines)

    def export_html(self, path: str | os.PathLike[str]) -> None:
        """Write one self-contained HTML page (inline SVG, no scripts or network resources).

        Args:
            path: a local path, or a URI any Hadoop FileSystem of the active Spark session handles
                (``hdfs://``, ``s3a://``, ``file://``); created or overwritten.
        """
        write_text(path, _render_html(self))


# -- HTML ---------------------------------------------------------------------------------------------
# Charts are inline SVG drawn in a fixed 600x300 coordinate box and scaled by the page (width 100% of a
# grid cell), legends are HTML below the plot, so nothing overlaps or leaves the page at any width from
# 1280 px down; at most _MAX_POINTS points per line are drawn.
_W, _H = 600, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 12, 40
_MAX_POINTS = 1500


def _esc(text: object) -> str:
    return html.escape(str(text))


def _num(value: float) -> str:
    """Whole numbers and values from 1000 up in full with thousands separators (328,700 bytes, not
    3.287e+05), smaller values to 4 significant digits."""
    if abs(value) < 1e15 and (float(value).is_integer() or abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-3 else f"{value:.3g}"


def _ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """About ``count`` round tick values covering [lo, hi]; whole numbers only with ``integer``."""
    if hi <= lo:
        return [lo]
    raw = max((hi - lo) / count, 1.0) if integer else (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)  # 2.5 is no whole number
    step = next(m * mag for m in steps if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= _MAX_POINTS:
        return points
    stride = len(points) / _MAX_POINTS
    return [points[int(i * stride)] for i in range(_MAX_POINTS)] + [points[-1]]


def _chart(title: str, lines: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """One line chart in a <figure>; lines with one point are drawn as dots. x values are counts
    (iterations, epochs, events): the x axis has whole-number ticks."""
    lines = {k: _thin(v) for k, v in lines.items() if v}
    pts = [p for ps in lines.values() for p in ps]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 > 0 and y0 < 0.5 * y1:
        y0 = 0.0  # a zero baseline unless the data sits far above it
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.5, y1 + (abs(y1) or 1) * 0.5
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return _TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{_esc(title)}">',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#bbb"/>',
    ]
    for t in _ticks(y0, y1):
        y = sy(t)
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_num(t)}</text>')
    for t in _ticks(x0, x1, integer=True):
        x = sx(t)
        out.append(f'<text x="{x:.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<text x="{_LEFT + pw / 2:.0f}" y="{_H - 6}" text-anchor="middle">{_esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate(14 {_TOP + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
        f"{_esc(ylabel)}</text>"
    )
    legend = []
    for i, (name, ps) in enumerate(sorted(lines.items())):
        c = _PALETTE[i % len(_PALETTE)]
        if len(ps) == 1:
            out.append(f'<circle cx="{sx(ps[0][0]):.1f}" cy="{sy(ps[0][1]):.1f}" r="4" fill="{c}"/>')
        else:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{coords}"/>')
        legend.append(f'<span><i style="background:{c}"></i>{_esc(name)}</span>')
    out.append("</svg>")
    return (
        f"<figure><figcaption>{_esc(title)}</figcaption>{''.join(out)}"
        f'<div class="legend">{"".join(legend)}</div></figure>'
    )


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _timeline(stats: SparkTrainingStats) -> str:
    evs = [(k, e) for k in stats.keys() for e in stats._events[k] if e.duration_ms > 0]
    if not evs:
        return ""
    lanes = sorted({(e.machine, e.process, e.thread) for _, e in evs})
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    colour = {k: _PALETTE[i % len(_PALETTE)] for i, k in enumerate(stats.keys())}
    t0 = min(e.start_ms for _, e in evs)
    span = max(max(e.start_ms + e.duration_ms for _, e in evs) - t0, 1e-3)
    width, left, lane_h = 1200, 170, 22
    height = lane_h * len(lanes) + 30
    scale = (width - left - 10) / span
    machines = sorted({lane[0] for lane in lanes})
    parts = [f'<svg viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for lane, i in lane_of.items():
        y = i * lane_h
        label = f"host {machines.index(lane[0])} pid {lane[1]} thread {lane[2] % 10000}"
        parts.append(f'<text x="4" y="{y + 15}">{_esc(label)}</text>')
    for key, e in evs:
        y = lane_of[(e.machine, e.process, e.thread)] * lane_h + 3
        x = left + (e.start_ms - t0) * scale
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{max(e.duration_ms * scale, 1.0):.1f}" height="{lane_h - 6}" '
            f'fill="{colour[key]}"><title>{_esc(key)}: {e.duration_ms:.1f} ms</title></rect>'
        )
    for t in _ticks(0, span):
        x = left + t * scale
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" text-anchor="middle">{_num(t)} ms</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{c}"></i>{_esc(k)}</span>' for k, c in colour.items())
    return (
        '<figure class="wide"><figcaption>Timeline of the phases per host, process and thread</figcaption>'
        f'{"".join(parts)}<div class="legend">{legend}</div></figure>'
    )


def _is_traffic(counter: str) -> bool:
    return any(word in counter for word in ("bytes", "messages", "frames", "updates"))


def _section(title: str, content: list[str]) -> str:
    content = [c for c in content if c]
    return f"<h2>{_esc(title)}</h2>" + "".join(content) if content else ""


def _render_html(stats: SparkTrainingStats) -> str:
    scores = stats.scores()
    epochs = stats.epoch_metrics()
    learning = [
        _chart(
            "Training loss per iteration",
            {k: list(v) for k, v in scores.items()},
            "iteration",
            "loss",
        )
    ]
    for metric in sorted({m for ms in epochs.values() for m in ms}):
        points = [(float(e), ms[metric]) for e, ms in epochs.items() if metric in ms]
        learning.append(
            _chart(f"{metric.replace('_', ' ').capitalize()} per epoch", {metric: points}, "epoch", metric)
        )
    series = stats.series()
    traffic = (
        [
            _chart(
                title,
                {w: [(r["iteration"], r[metric]) for r in recs] for w, recs in series.items()},
                "iteration",
                unit,
            )
            for metric, title, unit in (
                ("bytes_sent", "Bytes sent per iteration", "bytes"),
                ("density", "Update density (fraction of parameters encoded)", "density"),
                ("threshold", "Threshold", "threshold"),
            )
        ]
        if series
        else []
    )
    counters = sorted(stats.counters.items())
    traffic_counters = [(name, _num(value)) for name, value in counters if _is_traffic(name)]
    other_counters = [(name, _num(value)) for name, value in counters if not _is_traffic(name)]
    timing_rows = []
    timing_charts = []
    for key in stats.keys():
        d = [e.duration_ms for e in stats._events[key]]
        timing_rows.append(
            (key, str(len(d)), _num(sum(d) / len(d)), _num(min(d)), _num(max(d)), _num(sum(d)))
        )
        if len(d) > 1:  # a single event is a number in the table, not a chart
            evs = stats.events(key)
            timing_charts.append(
                _chart(key, {"ms": [(i, e.duration_ms) for i, e in enumerate(evs)]}, "event", "ms")
            )
    body = [
        "<h1>sparkgrad training report</h1>",
        f'<p class="note">Generated {time.strftime("%Y-%m-%d %H:%M:%S")}; times from each machine\'s '
        "system clock (worker clocks are not synchronised).</p>",
        _section(
            "Learning",
            [
                '<div class="charts">' + "".join(learning) + "</div>" if any(learning) else "",
                _table(other_counters, ("counter", "total")) if other_counters else "",
            ],
        ),
        _section(
            "Traffic",
            [
                '<div class="charts">' + "".join(traffic) + "</div>" if any(traffic) else "",
                _table(traffic_counters, ("counter", "total")) if traffic_counters else "",
            ],
        ),
        _section(
            "Phase timings",
            [
                _table(timing_rows, ("phase", "events", "mean ms", "min ms", "max ms", "total ms"))
                if timing_rows
                else "",
                '<div class="charts">' + "".join(timing_charts) + "</div>" if timing_charts else "",
                _timeline(stats),
            ],
        ),
    ]
    if not any(b for b in body[2:]):
        body.append("<p>Nothing was recorded.</p>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>sparkgrad training report</title><style>"
        + _CSS
        + "</style></head><body>"
        + "\n".join(b for b in body if b)
        + "</body></html>"
    )


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:0 auto;padding:16px 24px;max-width:1232px;color:#222}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}.note{color:#666}"
    ".charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:16px}"
    "figure{margin:0;min-width:0}figure.wide{margin-top:16px}figcaption{font-weight:600;margin-bottom:4px}"
    "svg{display:block;width:100%;height:auto;font-size:11px}"
    ".legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin-top:4px;overflow-wrap:anywhere}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}"
    "table{border-collapse:collapse;margin:8px 0;font-size:13px;max-width:100%}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}td:first-child,th:first-child"
    "{text-align:left;overflow-wrap:anywhere}"
)


def merge_all(parts: Iterable[SparkTrainingStats | None]) -> SparkTrainingStats:
    """One stats object holding everything in ``parts`` (None entries skipped)."""
    out = SparkTrainingStats()
    for p in parts:
        if p is not None:
            out.merge(p)
    return out


__all__ = ["EventStats", "SparkTrainingStats", "Timer", "event", "merge_all", "now_ms"]

"""Training statistics of distributed fits and their self-contained HTML report.

Times are wall-clock milliseconds from the system clock of the machine that recorded them (no NTP
correction): timelines of different machines are only as aligned as their clocks.
"""

from __future__ import annotations

import html
import math
import numbers
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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


def reset_peak_rss() -> None:
    """Restart this process's peak resident set size from its current size (Linux 4.0+; elsewhere a
    no-op), so that :func:`peak_rss_mib` measures one task in a Python worker that Spark reuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB since :func:`reset_peak_rss` (Linux: ``VmHWM``);
    NaN where the system does not report it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


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
    pairs. Epoch metrics: per epoch, the metrics an epoch callback returned and the ``accuracy`` and
    ``evaluation_score`` of the evaluation data.
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SparkTrainingStats:
        """The statistics :meth:`to_dict` gave (a checkpoint's); ValueError naming what does not fit."""
        out = cls()
        try:
            for key, events in data["events"].items():
                out._events[str(key)] = [EventStats(**e) for e in events]
            for worker, records in data["series"].items():
                out._series[str(worker)] = [{str(k): float(v) for k, v in r.items()} for r in records]
            for source, pairs in data["scores"].items():
                out._scores[str(source)] = [(float(i), float(v)) for i, v in pairs]
            for epoch, metrics in data["epochs"].items():
                out._epochs[int(epoch)] = {str(k): float(v) for k, v in metrics.items()}
            out.counters = {str(k): float(v) for k, v in data["counters"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"training stats: not what to_dict() writes ({type(exc).__name__}: {exc})"
            ) from None
        return out

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
# 1280 px down; at most _MAX_POINTS points per line are drawn. The left margin grows with the widest
# y tick label (bytes in the millions), so the labels never run into the rotated y-axis title.
_W, _H = 600, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 24, 12, 40  # _RIGHT: half of a "100,000" tick label
_FONT = 11  # px: the SVG text size (CSS below), one unit of the 600-wide box at 100% scale
_TITLE_X = 14  # baseline of the rotated y-axis title; its glyphs reach 0.8 em left, 0.25 em right
_GAP = 6  # between the y-axis title and the tick labels, and between the labels and the plot
_MAX_POINTS = 1500


def _esc(text: object) -> str:
    return html.escape(str(text))


def _num(value: float) -> str:
    """Whole numbers and values from 1000 up in full with thousands separators (328,700 bytes, not
    3.287e+05), smaller values to 4 significant digits."""
    if abs(value) < 1e15 and (float(value).is_integer() or abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-3 else f"{value:.3g}"


def _text_width(text: str) -> float:
    """Width in px of ``text`` at :data:`_FONT`, an upper bound for the sans-serif fonts browsers pick
    (DejaVu Sans digits are 0.64 em wide; separators and points are half that)."""
    return sum((0.33 if c in ",. " else 0.66) * _FONT for c in text)


def _plot_left(labels: list[str]) -> float:
    """The plot's left edge: room for the y-axis title, then the widest tick label."""
    title_right = _TITLE_X + 0.25 * _FONT
    return max(_LEFT, title_right + _GAP + max(map(_text_width, labels), default=0.0) + _GAP)


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


def _is_number(lines: dict[str, list[tuple[float, float]]]) -> bool:
    """The rule for every series of the report: one point (one epoch, iteration or event) per line is
    shown as a number, not as a chart of single dots."""
    return all(len(points) <= 1 for points in lines.values())


def _number(title: str, lines: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """Series of one point each as numbers in a <figure class="number">: value, unit, line and x."""
    rows = []
    for name, ((x, y),) in sorted((k, v) for k, v in lines.items() if v):
        where = f"{xlabel} {_num(x)}" if name == ylabel else f"{name}, {xlabel} {_num(x)}"
        rows.append(f"<p><b>{_num(y)}</b> {_esc(ylabel)} <span>({_esc(where)})</span></p>")
    return f'<figure class="number"><figcaption>{_esc(title)}</figcaption>{"".join(rows)}</figure>'


def _chart(title: str, lines: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """One line chart in a <figure>, or numbers when every line has one point (:func:`_is_number`). x
    values are counts (iterations, epochs, events): the x axis has whole-number ticks."""
    lines = {k: _thin(v) for k, v in lines.items() if v}
    if not lines:
        return ""
    if _is_number(lines):
        return _number(title, lines, xlabel, ylabel)
    pts = [p for ps in lines.values() for p in ps]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 > 0 and y0 < 0.5 * y1:
        y0 = 0.0  # a zero baseline unless the data sits far above it
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.5, y1 + (abs(y1) or 1) * 0.5
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y_ticks = [(t, _num(t)) for t in _ticks(y0, y1)]
    left = _plot_left([label for _, label in y_ticks])
    pw, ph = _W - left - _RIGHT, _H - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return _TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{_esc(title)}">',
        f'<rect x="{left:.1f}" y="{_TOP}" width="{pw:.1f}" height="{ph}" fill="#fff" stroke="#bbb"/>',
    ]
    for t, label in y_ticks:
        y = sy(t)
        out.append(f'<line x1="{left:.1f}" x2="{left + pw:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - _GAP:.1f}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for t in _ticks(x0, x1, integer=True):
        x = sx(t)
        out.append(f'<text x="{x:.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{_H - 6}" text-anchor="middle">{_esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate({_TITLE_X} {_TOP + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
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


def _figures(figures: list[str]) -> str:
    """Numbers in a row of their own, then the charts in a grid."""
    numbers = [f for f in figures if f.startswith('<figure class="number">')]
    charts = [f for f in figures if f and f not in numbers]
    return (f'<div class="numbers">{"".join(numbers)}</div>' if numbers else "") + (
        f'<div class="charts">{"".join(charts)}</div>' if charts else ""
    )


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
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
    machines = sorted({lane[0] for lane in lanes})
    labels = {
        lane: f"host {machines.index(lane[0])} pid {lane[1]} thread {lane[2] % 10000}" for lane in lanes
    }
    ticks = [(t, f"{_num(t)} ms") for t in _ticks(0, span)]
    # lane labels left of the bars; room on the right for half of the last tick label, centred on its tick
    width, lane_h = 1200, 22
    left = max(170.0, 4 + max(map(_text_width, labels.values())) + _GAP)
    right = max(10.0, _text_width(ticks[-1][1]) / 2 + 2)
    height = lane_h * len(lanes) + 30
    scale = (width - left - right) / span
    parts = [f'<svg viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for lane, i in lane_of.items():
        parts.append(f'<text x="4" y="{i * lane_h + 15}">{_esc(labels[lane])}</text>')
    for key, e in evs:
        y = lane_of[(e.machine, e.process, e.thread)] * lane_h + 3
        x = left + (e.start_ms - t0) * scale
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{max(e.duration_ms * scale, 1.0):.1f}" height="{lane_h - 6}" '
            f'fill="{colour[key]}"><title>{_esc(key)}: {e.duration_ms:.1f} ms</title></rect>'
        )
    for t, label in ticks:
        x = left + t * scale
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" text-anchor="middle">{label}</text>')
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
        name = metric.replace("_", " ")
        learning.append(_chart(f"{name.capitalize()} per epoch", {name: points}, "epoch", name))
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
        lines = {"ms": [(float(i), e.duration_ms) for i, e in enumerate(stats.events(key))]}
        if not _is_number(lines):  # a single event's number is in the table already
            timing_charts.append(_chart(key, lines, "event", "ms"))
    body = [
        "<h1>sparkgrad training report</h1>",
        f'<p class="note">Generated {time.strftime("%Y-%m-%d %H:%M:%S")}; times from each machine\'s '
        "system clock (worker clocks are not synchronised).</p>",
        _section(
            "Learning",
            [
                _figures(learning),
                _table(other_counters, ("counter", "total")) if other_counters else "",
            ],
        ),
        _section(
            "Traffic",
            [
                _figures(traffic),
                _table(traffic_counters, ("counter", "total")) if traffic_counters else "",
            ],
        ),
        _section(
            "Phase timings",
            [
                _table(timing_rows, ("phase", "events", "mean ms", "min ms", "max ms", "total ms"))
                if timing_rows
                else "",
                _figures(timing_charts),
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
    ".numbers{display:flex;flex-wrap:wrap;gap:12px 40px;margin:8px 0 16px}.numbers p{margin:2px 0}"
    ".numbers b{font-size:20px;margin-right:4px}.numbers span{color:#666;overflow-wrap:anywhere}"
    "figure{margin:0;min-width:0}figure.wide{margin-top:16px}figcaption{font-weight:600;margin-bottom:4px}"
    "svg{display:block;width:100%;height:auto;font-size:11px}"
    ".legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin-top:4px;overflow-wrap:anywhere}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}"
    "table{border-collapse:collapse;margin:8px 0;font-size:13px;max-width:100%}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}td:first-child,th:first-child"
    "{text-align:left;overflow-wrap:anywhere}"
)


def epoch_callback_result(value: Any) -> tuple[bool, dict[str, float]]:
    """What an epoch callback's return value says: (stop, metrics of the epoch).

    A mapping holds metrics, finite numbers under non-empty names (``{"accuracy": 0.95}``), and an
    optional bool under ``stop`` (False when left out); any other value stops when truthy and has no
    metrics.

    Raises:
        TypeError: a mapping with a non-bool ``stop``, a name that is no string or a value that is no
            number; the message shows the returned value.
        ValueError: a metric that is NaN or infinite.
    """
    if not isinstance(value, Mapping):
        return bool(value), {}
    where = f"epoch_callback returned {value!r}"
    stop = value.get("stop", False)
    if not isinstance(stop, (bool, np.bool_)):
        raise TypeError(f"{where}: 'stop' must be a bool, got {type(stop).__name__}")
    metrics: dict[str, float] = {}
    for name, number in value.items():
        if name == "stop":
            continue
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: metric names must be non-empty strings, got {name!r}")
        if isinstance(number, (bool, np.bool_)) or not isinstance(number, numbers.Real):
            raise TypeError(f"{where}: metric {name!r} must be a number, got {type(number).__name__}")
        if not math.isfinite(number):
            raise ValueError(f"{where}: metric {name!r} must be finite, got {number}")
        metrics[name] = float(number)
    return bool(stop), metrics


def run_epoch_callback(
    callback: Callable[[int, Any], Any] | None, epoch: int, network: Any, stats: SparkTrainingStats | None
) -> bool:
    """A training master's end of ``epoch``: ``callback(epoch, network)``, the metrics it returns
    recorded in ``stats`` (when collected); returns whether to stop (see :func:`epoch_callback_result`)."""
    if callback is None:
        return False
    stop, metrics = epoch_callback_result(callback(epoch, network))
    if stats is not None and metrics:
        stats.add_epoch_metrics(epoch, **metrics)
    return stop


def merge_all(parts: Iterable[SparkTrainingStats | None]) -> SparkTrainingStats:
    """One stats object holding everything in ``parts`` (None entries skipped)."""
    out = SparkTrainingStats()
    for p in parts:
        if p is not None:
            out.merge(p)
    return out


__all__ = [
    "EventStats",
    "SparkTrainingStats",
    "Timer",
    "epoch_callback_result",
    "event",
    "merge_all",
    "now_ms",
    "peak_rss_mib",
    "reset_peak_rss",
    "run_epoch_callback",
]

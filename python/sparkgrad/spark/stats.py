"""Training statistics of distributed fits and their self-contained HTML report.

Times are wall-clock milliseconds from the system clock of the machine that recorded them (no NTP
correction): timelines of different machines are only as aligned as their clocks.
"""

from __future__ import annotations

import html
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
    """Events per key (phase timings of the driver and the workers) plus per-worker iteration series.

    Series (gradient sharing): for each worker, one record per iteration with ``iteration``,
    ``threshold``, ``density`` (encoded fraction of the vector), ``bytes_sent`` and ``time_ms``.
    """

    def __init__(self) -> None:
        self._events: dict[str, list[EventStats]] = {}
        self._series: dict[str, list[dict[str, float]]] = {}
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

    def count(self, name: str, amount: float) -> None:
        """Add ``amount`` to the counter ``name``."""
        self.counters[name] = self.counters.get(name, 0.0) + amount

    def merge(self, other: SparkTrainingStats) -> SparkTrainingStats:
        """Add everything ``other`` recorded to this object; returns self."""
        for key, evs in other._events.items():
            self._events.setdefault(key, []).extend(evs)
        for worker, recs in other._series.items():
            self._series.setdefault(worker, []).extend(recs)
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

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable)."""
        return {
            "events": {k: [asdict(e) for e in self.events(k)] for k in self.keys()},
            "series": self.series(),
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
def _esc(text: object) -> str:
    return html.escape(str(text))


def _timeline(stats: SparkTrainingStats) -> str:
    evs = [(k, e) for k in stats.keys() for e in stats._events[k] if e.duration_ms > 0]
    if not evs:
        return "<p>No timed events.</p>"
    lanes = sorted({(e.machine, e.process, e.thread) for _, e in evs})
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    colour = {k: _PALETTE[i % len(_PALETTE)] for i, k in enumerate(stats.keys())}
    t0 = min(e.start_ms for _, e in evs)
    t1 = max(e.start_ms + e.duration_ms for _, e in evs)
    span = max(t1 - t0, 1e-3)
    width, left, lane_h = 1280, 230, 35
    height = lane_h * len(lanes) + 60
    scale = (width - left - 20) / span
    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    machines = sorted({lane[0] for lane in lanes})
    for lane, i in lane_of.items():
        y = 20 + i * lane_h
        label = f"PC {machines.index(lane[0])}, process {lane[1]}, thread {lane[2]}"
        parts.append(f'<text x="4" y="{y + 20}">{_esc(label)}</text>')
        parts.append(
            f'<line x1="{left}" y1="{y + lane_h}" x2="{width - 20}" y2="{y + lane_h}" stroke="#ddd"/>'
        )
    for key, e in evs:
        y = 20 + lane_of[(e.machine, e.process, e.thread)] * lane_h + 4
        x = left + (e.start_ms - t0) * scale
        w = max(e.duration_ms * scale, 1.0)
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 8}" fill="{colour[key]}">'
            f"<title>{_esc(key)}: {e.duration_ms:.1f} ms</title></rect>"
        )
    parts.append(
        f'<text x="{left}" y="{height - 10}">0 ms</text>'
        f'<text x="{width - 90}" y="{height - 10}">{span:.0f} ms</text></svg>'
    )
    legend = "".join(
        f'<span style="background:{c};padding:2px 8px;margin:2px;color:#fff">{_esc(k)}</span>'
        for k, c in colour.items()
    )
    return "".join(parts) + f"<p>{legend}</p>"


def _line_chart(title: str, lines: dict[str, list[tuple[float, float]]], xlabel: str) -> str:
    pts = [p for ps in lines.values() for p in ps]
    if not pts:
        return ""
    width, height, pad = 700, 400, 55
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(min(ys), 0.0), max(ys)
    sx = (width - 2 * pad) / max(x1 - x0, 1e-12)
    sy = (height - 2 * pad) / max(y1 - y0, 1e-12)
    out = [
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
        f'<text x="{pad}" y="20" font-size="14">{_esc(title)}</text>',
        f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" fill="none" '
        f'stroke="#999"/>',
        f'<text x="{pad}" y="{height - 25}">{x0:g}</text><text x="{width - pad - 40}" y="{height - 25}">'
        f'{x1:g}</text><text x="{width / 2 - 30:.0f}" y="{height - 8}">{_esc(xlabel)}</text>',
        f'<text x="2" y="{pad + 4}">{y1:.3g}</text><text x="2" y="{height - pad}">{y0:.3g}</text>',
    ]
    for i, (name, ps) in enumerate(sorted(lines.items())):
        coords = " ".join(f"{pad + (x - x0) * sx:.1f},{height - pad - (y - y0) * sy:.1f}" for x, y in ps)
        c = _PALETTE[i % len(_PALETTE)]
        out.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{coords}">'
            f"<title>{_esc(name)}</title></polyline>"
        )
        out.append(f'<text x="{width - pad - 150}" y="{pad + 14 + 14 * i}" fill="{c}">{_esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _render_html(stats: SparkTrainingStats) -> str:
    body = [
        "<h1>sparkgrad - Spark Training Analysis</h1>",
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')} (system clock; worker clocks are not "
        "synchronised).</p>",
        "<h2>Timeline: Training Activities</h2>",
        _timeline(stats),
        "<h2>Summary</h2>",
        f"<pre>{_esc(stats.summary())}</pre>",
        "<h2>Phase durations</h2>",
    ]
    for key in stats.keys():
        evs = stats.events(key)
        body.append(
            _line_chart(
                f"{key} (ms per event)",
                {key: [(i, e.duration_ms) for i, e in enumerate(evs)]},
                "event index (by start time)",
            )
        )
    series = stats.series()
    if series:
        body.append("<h2>Gradient sharing per iteration</h2>")
        for metric, title in (
            ("threshold", "Threshold"),
            ("density", "Update density (fraction encoded)"),
            ("bytes_sent", "Bytes sent per iteration"),
        ):
            body.append(
                _line_chart(
                    title,
                    {w: [(r["iteration"], r[metric]) for r in recs] for w, recs in series.items()},
                    "iteration",
                )
            )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>sparkgrad training stats</title>'
        "<style>body{font-family:sans-serif;margin:20px}svg{display:block;margin:8px 0}</style></head>"
        "<body>" + "\n".join(body) + "</body></html>"
    )


def merge_all(parts: Iterable[SparkTrainingStats | None]) -> SparkTrainingStats:
    """One stats object holding everything in ``parts`` (None entries skipped)."""
    out = SparkTrainingStats()
    for p in parts:
        if p is not None:
            out.merge(p)
    return out


__all__ = ["EventStats", "SparkTrainingStats", "Timer", "event", "merge_all", "now_ms"]

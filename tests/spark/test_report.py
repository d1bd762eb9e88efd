"""Training stats across fits (score per iteration, metrics per epoch) and the HTML report built from them."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from helpers import mlp_conf, subset

from prerequisites import require_or_skip
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer
from sparkgrad.spark.stats import EventStats, SparkTrainingStats

FIT_KEY = "ParameterAveragingMasterFitTimesMs"


def test_stats_accumulate_across_fits_until_reset(spark, digits) -> None:
    test = subset(digits[1], 100)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=2,
        num_workers=2,
        rdd_data_set_num_examples=16,
        rng_seed=0,
        collect_training_stats=True,
    )
    rdd = spark.sparkContext.parallelize(subset(digits[0], 128).split(16), 2)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as sm:
        assert sm.training_stats is None
        sm.evaluation_data = test
        sm.fit(rdd, epochs=2)
        sm.fit(rdd)
        stats = sm.training_stats
        assert len(stats.events(FIT_KEY)) == 2
        # 128 examples, 2 workers x 16 x 2 per round: 2 rounds per epoch, 3 epochs
        ((source, pairs),) = stats.scores().items()
        assert len(pairs) == 6 and all(np.isfinite(s) and s > 0 for _, s in pairs)
        assert [it for it, _ in pairs] == sorted(it for it, _ in pairs)
        assert pairs[-1][0] == sm.network.iteration_count
        # the model's score is the mean over the last epoch's rounds
        assert (pairs[-1][1] + pairs[-2][1]) / 2 == pytest.approx(sm.score(), rel=1e-9)
        epochs = stats.epoch_metrics()
        assert list(epochs) == [0, 1, 2]
        # the last epoch's metrics are those of the final network
        assert epochs[2]["accuracy"] == sm.network.evaluate(test).accuracy()
        assert epochs[2]["evaluation_score"] == pytest.approx(sm.network.score(test), rel=1e-6)
        assert all(0 <= m["accuracy"] <= 1 for m in epochs.values())
        sm.reset_training_stats()
        assert sm.training_stats is None
        sm.evaluation_data = None
        sm.fit(rdd)
        assert len(sm.training_stats.events(FIT_KEY)) == 1 and sm.training_stats.epoch_metrics() == {}
        with pytest.raises(TypeError, match="evaluation_data: expected a DataSet with labels"):
            sm.evaluation_data = test.features


def _stats() -> SparkTrainingStats:
    stats = SparkTrainingStats()
    ev = EventStats("host-a", 11, 1, 1_000.0, 12.5)
    stats.add("OneShotPhaseMs", ev)
    for i in range(4):
        stats.add("RepeatedPhaseMs", EventStats("host-a", 11, 2, 1_000.0 + 10 * i, 5.0 + i))
    for i in range(30):
        stats.add_score("worker-1", i, 2.0 / (i + 1))
        # bytes in the billions, the widest y tick labels the report gets: ticks 0 to 4e9 put
        # "2,000,000,000" level with the middle of the y-axis title
        record = {"iteration": i, "threshold": 0.01, "density": 0.002, "bytes_sent": 4e9 * (i + 1) / 30}
        stats.add_series("worker-1", {**record, "time_ms": i})
    stats.add_epoch_metrics(0, accuracy=0.5)
    stats.add_epoch_metrics(1, accuracy=0.75)
    stats.count("worker_bytes_sent", 12000.0)
    stats.count("epochs", 2.0)
    return stats


def test_report_order_and_one_event_metrics(tmp_path) -> None:
    path = tmp_path / "report.html"
    _stats().export_html(path)
    page = path.read_text(encoding="utf-8")
    order = [
        page.index(t)
        for t in (
            "Training loss per iteration",
            "Accuracy per epoch",
            "<h2>Traffic",
            "Bytes sent per iteration",
            "Threshold",
            "<h2>Phase timings",
        )
    ]
    assert order == sorted(order)
    # one event: a row of numbers, no chart; several: both
    assert re.search(r"<td>OneShotPhaseMs</td><td>1</td><td>12.5</td>", page)
    assert "<figcaption>OneShotPhaseMs</figcaption>" not in page
    assert "<figcaption>RepeatedPhaseMs</figcaption>" in page
    assert "<td>worker_bytes_sent</td><td>12,000</td>" in page  # a count in full, not 1.2e+04
    # the accuracy chart plots exactly the two recorded epochs
    accuracy = page[page.index("Accuracy per epoch") :]
    accuracy = accuracy[: accuracy.index("</figure>")]
    points = re.search(r'points="([^"]+)"', accuracy).group(1).split()
    assert len(points) == 2
    (x0, y0), (x1, y1) = (tuple(map(float, p.split(","))) for p in points)
    assert x1 > x0 and y1 < y0  # later epoch to the right, higher accuracy drawn higher
    # epochs are whole numbers: the x axis has ticks 0 and 1, no 0.2, 0.4, ...
    assert re.findall(r'text-anchor="middle">([^<]+)</text>', accuracy) == ["0", "1", "epoch", "accuracy"]
    assert "<script" not in page and "src=" not in page


def _figure(page: str, title: str) -> str:
    """The <figure> of ``title`` in ``page``."""
    start = page.index(f"<figcaption>{title}</figcaption>")
    return page[page.rindex("<figure", 0, start) : page.index("</figure>", start)]


def _plotted(figure: str) -> list[tuple[float, float]]:
    """The points of a chart's one polyline in data units, read back through its tick labels."""
    y_ticks = [
        (float(y) - 4, float(label.replace(",", "")))  # labels sit 4 units below their tick
        for y, label in re.findall(r'<text x="[^"]+" y="([^"]+)" text-anchor="end">([^<]+)</text>', figure)
    ]
    x_ticks = [
        (float(x), float(label.replace(",", "")))
        for x, label in re.findall(
            r'<text x="([^"]+)" y="[^"]+" text-anchor="middle">([\d,.]+)</text>', figure
        )
    ]
    assert len(y_ticks) >= 2 and len(x_ticks) >= 2, figure

    def unscale(ticks: list[tuple[float, float]], at: float) -> float:
        (a, va), (b, vb) = ticks[0], ticks[-1]
        return va + (at - a) / (b - a) * (vb - va)

    points = re.search(r'points="([^"]+)"', figure).group(1).split()
    return [
        (unscale(x_ticks, float(x)), unscale(y_ticks, float(y))) for x, y in (p.split(",") for p in points)
    ]


def test_report_charts_the_metrics_an_epoch_callback_returned(spark, digits, tmp_path) -> None:
    train, test = subset(digits[0], 128), subset(digits[1], 100)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=4, rng_seed=0, collect_training_stats=True
    )
    returned: list[float] = []

    def callback(epoch: int, network) -> dict:
        returned.append(float(network.evaluate(test).accuracy()))
        return {"accuracy": returned[-1], "stop": False}

    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as sm:
        sm.fit(spark.sparkContext.parallelize(train.split(16), 2), epochs=4, epoch_callback=callback)
        assert len(returned) == 4 and len(set(returned)) > 1
        path = tmp_path / "report.html"
        sm.training_stats.export_html(path)
    figure = _figure(path.read_text(encoding="utf-8"), "Accuracy per epoch")
    assert '<div class="legend"><span><i style="background:#4e79a7"></i>accuracy</span></div>' in figure
    spread = max(returned) - min(returned)
    for (epoch, value), (want_epoch, want) in zip(_plotted(figure), enumerate(returned), strict=True):
        assert epoch == pytest.approx(want_epoch, abs=0.01)
        assert value == pytest.approx(want, abs=spread / 500)  # SVG coordinates have 0.1 unit steps


def test_one_point_series_are_numbers_and_longer_ones_charts(tmp_path) -> None:
    stats = SparkTrainingStats()
    stats.add_epoch_metrics(0, accuracy=0.875, evaluation_score=0.4321)
    for worker in ("worker-0", "worker-1"):
        stats.add_series(
            worker,
            {"iteration": 0, "threshold": 0.001, "density": 0.0025, "bytes_sent": 3_276_800, "time_ms": 1},
        )
    for i in range(5):
        stats.add_score("worker-0", i, 1.0 / (i + 1))
    path = tmp_path / "report.html"
    stats.export_html(path)
    page = path.read_text(encoding="utf-8")
    numbers = {
        "Accuracy per epoch": ["<b>0.875</b> accuracy <span>(epoch 0)</span>"],
        "Evaluation score per epoch": ["<b>0.4321</b> evaluation score <span>(epoch 0)</span>"],
        "Bytes sent per iteration": [
            f"<b>3,276,800</b> bytes <span>({w}, iteration 0)</span>" for w in ("worker-0", "worker-1")
        ],
        "Update density (fraction of parameters encoded)": [
            f"<b>0.0025</b> density <span>({w}, iteration 0)</span>" for w in ("worker-0", "worker-1")
        ],
        "Threshold": [
            f"<b>0.001</b> threshold <span>({w}, iteration 0)</span>" for w in ("worker-0", "worker-1")
        ],
    }
    for title, values in numbers.items():
        figure = _figure(page, title)
        assert figure.startswith('<figure class="number">') and "<svg" not in figure
        assert re.findall(r"<p>(.*?)</p>", figure) == values
        assert f'aria-label="{title}"' not in page
    loss = _figure(page, "Training loss per iteration")
    assert '<svg viewBox="0 0 600 300"' in loss and len(_plotted(loss)) == 5
    assert _plotted(loss)[-1][1] == pytest.approx(0.2, abs=0.01)


# DejaVu Sans (the sans-serif font of Debian's Chromium) advance widths in em; glyphs not listed are
# taken as wide as a digit. A rotated label's glyphs reach its ascent left of the baseline, its descent right.
_EM = {",": 0.318, ".": 0.318, " ": 0.318}
_DIGIT_EM, _DESCENT_EM, _FONT_PX = 0.636, 0.236, 11


def test_y_tick_labels_leave_room_for_the_axis_title(tmp_path) -> None:
    path = tmp_path / "report.html"
    _stats().export_html(path)
    page = path.read_text(encoding="utf-8")
    assert "svg{display:block;width:100%;height:auto;font-size:11px}" in page  # the size measured here
    charts = re.findall(r'<svg viewBox="0 0 600 300"[^>]*aria-label="([^"]+)">(.*?)</svg>', page)
    assert {"Bytes sent per iteration", "Training loss per iteration"} <= {t for t, _ in charts}
    for title, svg in charts:
        (title_x,) = re.findall(r'<text transform="translate\(([\d.]+) [\d.]+\) rotate\(-90\)"', svg)
        title_right = float(title_x) + _DESCENT_EM * _FONT_PX
        labels = re.findall(r'<text x="([\d.]+)" y="[^"]+" text-anchor="end">([^<]+)</text>', svg)
        assert labels, title
        for x, label in labels:
            width = sum(_EM.get(c, _DIGIT_EM) for c in label) * _FONT_PX
            assert float(x) - width >= title_right + 2, (title, label)
    assert ">2,000,000,000</text>" in dict(charts)["Bytes sent per iteration"]  # the case needing room


def test_empty_stats_render_a_clear_page(tmp_path) -> None:
    path = tmp_path / "empty.html"
    SparkTrainingStats().export_html(path)
    assert "Nothing was recorded." in path.read_text(encoding="utf-8")


def _chromium() -> str | None:
    for name in (
        "chromium",
        "chromium-headless-shell",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ):
        found = shutil.which(name)
        if found:
            return found
    return None


# measured in the page by the test's own copy of the report (the report itself has no scripts): the
# page width, elements past the right edge, and pairs of texts of one SVG whose boxes overlap (a y-axis
# title and wide tick labels, crowded ticks)
_MEASURE = """<script>
const over = [...document.querySelectorAll("svg, figure, table, .legend, h1, h2, p")]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5).length;
let clashes = 0;
for (const svg of document.querySelectorAll("svg")) {
  const r = [...svg.querySelectorAll("text")].map(t => t.getBoundingClientRect());
  for (let i = 0; i < r.length; i++) for (let j = i + 1; j < r.length; j++)
    if (Math.min(r[i].right, r[j].right) - Math.max(r[i].left, r[j].left) > 0.5 &&
        Math.min(r[i].bottom, r[j].bottom) - Math.max(r[i].top, r[j].top) > 0.5) clashes++;
}
document.body.setAttribute("data-check",
  [document.documentElement.scrollWidth, window.innerWidth, over, clashes].join(","));
</script>"""


def test_report_renders_at_1280_px_in_headless_chromium(tmp_path) -> None:
    browser = _chromium()
    require_or_skip("chromium", browser is not None, "no Chromium or Chrome on PATH (install chromium)")
    report = tmp_path / "report.html"
    _stats().export_html(report)
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"), "utf-8")
    common = [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--hide-scrollbars",
        "--window-size=1280,2400",
    ]
    dom = subprocess.run(
        [*common, "--virtual-time-budget=2000", "--dump-dom", probe.as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    check = re.search(r'data-check="(\d+),(\d+),(\d+),(\d+)"', dom)
    assert check is not None, dom[-2000:]
    scroll_width, window_width, overflowing, clashes = map(int, check.groups())
    assert window_width == 1280 and scroll_width <= 1280 and overflowing == 0 and clashes == 0
    shot = tmp_path / "report.png"  # kept with the test's files for a look
    subprocess.run(
        [*common, f"--screenshot={shot}", report.as_uri()], check=True, capture_output=True, timeout=120
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

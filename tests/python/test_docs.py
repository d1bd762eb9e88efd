"""The documentation cannot go stale: the site builds in strict mode, its examples and the README's run.

Pages whose examples need Spark run in tests/spark/test_docs_examples.py; see doc_examples.py for the
conventions (``<!-- docs-test: spark -->``, ``<!-- skip: REASON -->``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from doc_examples import DOCS, ROOT, pages, run_page, unexplained_skips

FLOAT32_EPS = float(np.finfo(np.float32).eps)

LOCAL_PAGES = [p for p in pages() if not p.needs_spark]
# what a user imports: each has its page in the API reference (docs/reference/*.md, `::: module`)
PUBLIC_MODULES = [
    "sparkgrad",
    "sparkgrad.compress",
    "sparkgrad.cuda",
    "sparkgrad.data",
    "sparkgrad.datasets",
    "sparkgrad.device",
    "sparkgrad.errors",
    "sparkgrad.eval",
    "sparkgrad.ml",
    "sparkgrad.mlflow",
    "sparkgrad.nn",
    "sparkgrad.nn.schedules",
    "sparkgrad.nn.updaters",
    "sparkgrad.parallel",
    "sparkgrad.spark",
    "sparkgrad.transport",
]
# the package's modules that are not imported by users: the command line and the native module loader
NOT_API = {"cli"}


def _mkdocs_missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:
            return module
    return None


@pytest.mark.skipif(
    _mkdocs_missing() is not None,
    reason=f"{_mkdocs_missing()} is not installed (mkdocs-material and mkdocstrings[python] come with the "
    "test extra)",
)
def test_site_builds_in_strict_mode(tmp_path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about MkDocs 2 is not a warning
    # the build must not need the network: a fetch goes to a closed port and fails the build
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[proxy] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    reference = (tmp_path / "site" / "reference" / "spark" / "index.html").read_text(encoding="utf-8")
    assert 'id="sparkgrad.spark.SharedTrainingMaster"' in reference  # mkdocstrings rendered the API


def test_api_reference_covers_every_public_module() -> None:
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.MULTILINE))
    assert sorted(set(PUBLIC_MODULES) - documented) == []
    package = ROOT / "python" / "sparkgrad"
    top_level = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    top_level = {m for m in top_level if not m.startswith("_") and m not in NOT_API | {"__pycache__"}}
    assert sorted(f"sparkgrad.{m}" for m in top_level if f"sparkgrad.{m}" not in documented) == []


# Accuracy bounds: each example trained with its seeds (and data seeds) replaced by 5-6 others; the
# bound sits below the lowest of them by about the spread, so a change that costs accuracy fails.


def _check_local_training(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.nn import MultiLayerNetwork

    test = namespace["test"]
    # seeds 7, 1-4: convolution 0.919-0.936, clipped 0.897-0.908, scheduled 0.933-0.947, wrapper 0.905-0.914
    assert namespace["evaluation"].accuracy() > 0.90
    assert namespace["clipped_net"].evaluate(test).accuracy() > 0.88
    assert namespace["scheduled_net"].evaluate(test).accuracy() > 0.91
    assert namespace["net"].evaluate(test).accuracy() > 0.89  # the ParallelWrapper's network
    # the Deconvolution2D autoencoder (seed 0): mean squared error 0.18 -> 0.02 over 5 epochs
    assert namespace["autoencoder"].score(namespace["reconstruct"]) < namespace["untrained_mse"] / 5
    # 0.1 for two epochs, then 0.01; the first 20 iterations ramp linearly to it: (i + 1) / 20 of 0.1
    assert "[0.005, 0.05, 0.1, 0.1] 0.01\n" in output
    # saved with its updater state and counters, "so training goes on where it stopped"
    again = namespace["again"]
    assert again.epoch_count == 3 and again.iteration_count == 3 * len(namespace["train"].split(32))
    assert np.any(again.updater_state() != 0)
    reloaded = MultiLayerNetwork.load(tmp_path / "digits-cnn.zip", load_updater=False)
    np.testing.assert_array_equal(reloaded.params(), again.params())
    assert reloaded.updater_state() is None or not np.any(reloaded.updater_state())


def _check_recurrent(namespace: dict, output: str, tmp_path) -> None:
    net, x, data = namespace["net"], namespace["x"], namespace["data"]
    # seeds 0-6 (network and data): accuracy 0.988-1.0 on the training sequences, score 0.005-0.038;
    # untrained 0.59-0.82 (some untrained networks already separate the signs: the score tells)
    assert net.evaluate(data).accuracy() > 0.97
    assert net.score(data) < 0.1
    assert net.output(x[:2], features_mask=namespace["mask"][:2]).shape == (2, 2)
    # the transformer encoder on the order task (seeds 0-9 of test_attention: 0.9 within 5-11 epochs)
    assert namespace["encoder_net"].evaluate(namespace["order_data"]).accuracy() > 0.9
    # rnn_time_step continues from the previous call's state: 6 steps then 6 equal all 12 at once, and
    # differ from the last 6 started afresh. 12 steps, each reducing 1 input + 8 recurrent units.
    net.rnn_clear_previous_state()
    whole = net.rnn_time_step(x[:2])
    net.rnn_clear_previous_state()
    fresh = net.rnn_time_step(x[:2, :, 6:])
    net.rnn_clear_previous_state()
    np.testing.assert_allclose(namespace["rest"], whole, rtol=0, atol=12 * (1 + 8) * FLOAT32_EPS)
    assert np.abs(namespace["rest"] - fresh).max() > 1e-3
    # merged: padded to the longest (9 steps) with zeros, the short one's last 5 steps masked
    merged = namespace["merged"]
    assert merged.features.shape == (2, 1, 9)
    np.testing.assert_array_equal(merged.features_mask, [[1] * 4 + [0] * 5, [1] * 9])
    np.testing.assert_array_equal(merged.features[0, :, 4:], 0)
    np.testing.assert_array_equal(merged.features[0, :, :4], x[0, :, :4])
    assert "(2, 1, 9)" in output
    assert namespace["tag_probabilities"].shape == (64, 5, 10)
    assert namespace["trend_probabilities"].shape == (64, 2)
    assert "(64, 5, 10) (64, 2)" in output


def _check_migration(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    shared, averaging = namespace["shared"], namespace["averaging"]
    assert (shared.batch_size_per_worker, shared.workers_per_node) == (32, 2)
    assert (averaging.rdd_data_set_num_examples, averaging.batch_size_per_worker) == (1, 16)
    assert averaging.averaging_frequency == 5
    # "every configuration object is a validated dataclass that round-trips through JSON and YAML"
    assert ParameterAveragingTrainingMaster.from_json(averaging.to_json()) == averaging
    assert SharedTrainingMaster.from_yaml(shared.to_yaml()) == shared
    assert ParameterAveragingTrainingMaster.from_yaml(averaging.to_yaml()) == averaging


def _check_keras_import(namespace: dict, output: str, tmp_path) -> None:
    # 12 steps, each reducing 8 inputs + 16 recurrent units, then the Dense's 16: float32 rounding
    tolerance = 8 * FLOAT32_EPS * 12 * (8 + 16) * 2
    assert set(namespace["differences"]) == {"text.keras", "text.h5"}
    assert max(namespace["differences"].values()) < tolerance, namespace["differences"]
    assert namespace["ours"].shape == (4, 2)
    # the Functional example: dot products of at most 8 + 3 terms, three layers deep
    graph = namespace["graph"]
    assert type(graph).__name__ == "ComputationGraph"
    assert (graph.conf.inputs, graph.conf.outputs) == (["a", "b"], ["kind", "size"])
    assert [graph.conf.spec(n).vertex.loss.value for n in graph.conf.outputs] == ["mcxent", "mse"]
    assert max(namespace["graph_differences"]) < 8 * FLOAT32_EPS * 11 * 3, namespace["graph_differences"]


def _check_onnx_import(namespace: dict, output: str, tmp_path) -> None:
    # what the page shows: the vertices (activations folded into their layers) and the output's loss
    vertices = "conv ConvolutionLayer\npool SubsamplingLayer\nflatten PreprocessorVertex\nfc OutputLayer\n"
    assert vertices in output
    net = namespace["net"]
    assert net.conf.spec("conv").vertex.activation.value == "relu"
    assert net.conf.spec("fc").vertex.loss.value == "mcxent"
    # dot products of 1568 terms (the Gemm) after 9 (the convolution)
    assert namespace["difference"] < 8 * FLOAT32_EPS * 1568 * 2, namespace["difference"]
    assert net.score(namespace["data"]) < namespace["before"]


DL4J_MOON = ROOT / "tests" / "python" / "nn" / "data" / "dl4j" / "MLPMoon"


def _place_dl4j_model(workdir) -> None:
    # the page's "dl4j-model.zip": a zip DL4J wrote (its MLPMoon integration-test baseline)
    shutil.copy(DL4J_MOON / "Model_RANDOM_INIT_UNTRAINED.zip", workdir / "dl4j-model.zip")


def _check_dl4j_import(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.data import read_nd4j_array

    assert "0  DenseLayer" in output and "1  OutputLayer" in output and "Total parameters: 102" in output
    # DL4J's own output for that row (its predictions/output_0_0.bin): dot products of 2 then 20 terms
    expected = read_nd4j_array(DL4J_MOON / "predictions" / "output_0_0.bin")
    got = namespace["net"].output(namespace["first"])
    np.testing.assert_allclose(got, expected, rtol=0, atol=8 * FLOAT32_EPS * 20 * 2)


def _check_transfer_learning(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.nn import FrozenLayer

    parity, digits = namespace["parity"], namespace["digits"]
    assert isinstance(parity.conf.layers[0], FrozenLayer) and "0  FrozenLayer" in output
    # layer 0 keeps what `digits` trained, bit for bit, and training leaves it so
    np.testing.assert_array_equal(namespace["extractor"], digits.params()[: 64 * 32 + 32])
    np.testing.assert_array_equal(parity.params()[: 64 * 32 + 32], namespace["extractor"])
    # seed 0: 0.931 (8 seeds, three updaters: 0.887-0.931; from scratch 0.807-0.855)
    assert namespace["accuracy"] > 0.86 and "odd/even accuracy from 40 examples: 0." in output
    graph, new = namespace["graph"], namespace["graph_parity"]
    frozen = namespace["frozen"]
    assert {n: type(new.conf.spec(n).vertex).__name__ for n in ("a", "b", "c", "head", "out")} == {
        "a": "FrozenLayer",
        "b": "FrozenLayer",
        "c": "FrozenLayer",
        "head": "DenseLayer",
        "out": "OutputLayer",
    }
    np.testing.assert_array_equal(namespace["frozen_before"], graph.params()[:frozen])
    np.testing.assert_array_equal(new.params()[:frozen], namespace["frozen_before"])
    assert new.conf.spec("out").inputs == ["head"]


# page -> a check of what the page claims, given the examples' namespace, their output and the directory
CHECKS = {
    "docs/guides/dl4j-import.md": _check_dl4j_import,
    "docs/guides/keras-import.md": _check_keras_import,
    "docs/guides/local-training.md": _check_local_training,
    "docs/guides/onnx-import.md": _check_onnx_import,
    "docs/guides/recurrent.md": _check_recurrent,
    "docs/guides/transfer-learning.md": _check_transfer_learning,
    "docs/migration.md": _check_migration,
}

# page -> what its examples expect to find in the directory they run in
SETUP = {"docs/guides/dl4j-import.md": _place_dl4j_model}


@pytest.mark.parametrize("page", LOCAL_PAGES, ids=[p.name for p in LOCAL_PAGES])
def test_page_examples_run(page, tmp_path, capsys) -> None:
    if page.name in SETUP:
        SETUP[page.name](tmp_path)
    namespace = run_page(page, tmp_path)
    if any(not example.skip for example in page.examples):
        CHECKS[page.name](namespace, capsys.readouterr().out, tmp_path)


def test_every_page_that_runs_has_a_check() -> None:
    runs = {p.name for p in LOCAL_PAGES if any(not example.skip for example in p.examples)}
    assert sorted(runs ^ set(CHECKS)) == []


def test_skipped_examples_say_why_on_the_page() -> None:
    assert {p.name: unexplained_skips(p) for p in pages() if unexplained_skips(p)} == {}


def test_readme_is_short_and_keeps_the_ci_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = ci.split("# --- README test command (keep identical to README.md) ---\n", 1)[1].strip()
    assert f"```bash\n{command}\n```" in readme
    assert '```bash\npip install ".[demo]" && sparkgrad demo\n```' in readme
    # relative links into the docs work on GitHub too: each names a file that exists
    for target in re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).is_file(), target

"""Mixed precision (the network configurations' ``precision``): configuration, the thread-local GEMM mode,
fp16's dynamic loss scaling, persistence and the CPU's behaviour.

The loss scaler's logic runs on the emulated device of ``tests/python/emulated_device.py`` (mixed precision
applies off the CPU; its kernels are the CPU's, so float32 arithmetic): loss scaling by a power of two is
exact there, so an fp16 network trains bitwise as a float32 one, and a non-finite gradient is injected.
The ``cuda`` tests check the real thing on a GPU: the mode reaches cuBLAS, a bf16 / fp16 step scores close
to float32, the scaler skips a step with an inf, and a digits CNN learns as well as in float32.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from emulated_device import EmulatedDevice

from prerequisites import require_gpu
from sparkgrad import cuda
from sparkgrad._native import _core
from sparkgrad.compress import EncodingHandler, FixedThresholdAlgorithm
from sparkgrad.data import DataSet, ListDataSetIterator, MultiDataSet
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn import (
    LSTM,
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
    _precision,
)
from sparkgrad.nn._precision import LossScaler, gemm_precision
from sparkgrad.nn.listeners import TrainingListener
from sparkgrad.nn.serialization import META_MEMBER
from sparkgrad.nn.updaters import Adam, Sgd

# A CUDA build reads the current GPU to keep the mode per device: without one it cannot hold a mode.
needs_mode = pytest.mark.skipif(
    cuda.built() and not _core.cuda_available(), reason="a CUDA build keeps the mode per visible GPU"
)


def _mlp_conf(precision: str = "float32", **kw: Any) -> MultiLayerConfiguration:
    return MultiLayerConfiguration(
        [DenseLayer(12, activation="relu", dropout=0.8), DenseLayer(8, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(7),
        updater=Adam(1e-2),
        l2=1e-3,
        seed=11,
        precision=precision,
        **kw,
    )


def _graph_conf(precision: str = "float32") -> ComputationGraphConfiguration:
    """Two outputs: each one's loss gradient carries the scale."""
    return (
        ComputationGraphConfiguration.builder(seed=16, updater=Adam(1e-2), precision=precision)
        .add_inputs("a")
        .set_input_types(InputType.recurrent(3))
        .add_layer("lstm", LastTimeStep(LSTM(5)), "a")
        .add_layer("d", DenseLayer(6, activation="relu"), "lstm")
        .add_layer("out1", OutputLayer(3), "d")
        .add_layer("out2", OutputLayer(2, loss="mse", activation="identity"), "lstm")
        .set_outputs("out1", "out2")
        .build()
    )


def _mlp_batches(n: int = 4) -> list[DataSet]:
    rng = np.random.default_rng(3)
    return [
        DataSet(
            rng.normal(size=(10, 7)).astype(np.float32), np.eye(3, dtype=np.float32)[rng.integers(0, 3, 10)]
        )
        for _ in range(n)
    ]


def _graph_batches(n: int = 3) -> list[MultiDataSet]:
    rng = np.random.default_rng(4)
    return [
        MultiDataSet(
            [rng.normal(size=(6, 3, 4)).astype(np.float32)],
            [np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)], rng.normal(size=(6, 2)).astype(np.float32)],
        )
        for _ in range(n)
    ]


def _inject_inf(net: Any, steps: set[int]) -> None:
    """From now on the ``steps``-th gradients computed (0 = the next) get an inf: what an fp16 overflow of
    the scaled loss gradient leaves in the flat gradient."""
    original, count = net._gradient, [0]

    def gradient(dataset: Any, loss_scale: float = 1.0) -> float:
        score = original(dataset, loss_scale)
        if count[0] in steps:
            net._grad[5] = np.inf
        count[0] += 1
        return score

    net._gradient = gradient


# -- configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["float32", "bf16", "fp16"])
def test_precision_round_trips_json_and_yaml(precision: str) -> None:
    for conf in (_mlp_conf(precision), _graph_conf(precision)):
        assert conf.precision == precision
        for text, parse in ((conf.to_json(), type(conf).from_json), (conf.to_yaml(), type(conf).from_yaml)):
            back = parse(text)
            assert back == conf and back.precision == precision


def test_precision_defaults_to_float32_also_in_older_configurations() -> None:
    assert _mlp_conf().precision == "float32"
    assert (
        ComputationGraphConfiguration.builder()
        .add_inputs("a")
        .set_input_types(InputType.feed_forward(2))
        .add_layer("o", OutputLayer(2), "a")
        .set_outputs("o")
        .build()
        .precision
        == "float32"
    )
    data = json.loads(_mlp_conf("bf16").to_json())
    del data["precision"]  # written before the field existed
    assert MultiLayerConfiguration.from_json(json.dumps(data)).precision == "float32"


@pytest.mark.parametrize("bad", ["float16", "bfloat16", "FP16", "", None, 16])
def test_an_unknown_precision_is_rejected_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"precision: expected 'float32', 'bf16' or 'fp16', got"):
        _mlp_conf(bad)
    with pytest.raises(ValueError, match=r"precision: expected 'float32', 'bf16' or 'fp16'"):
        ComputationGraphConfiguration.builder(precision=bad).add_inputs("a").set_input_types(
            InputType.feed_forward(2)
        ).add_layer("o", OutputLayer(2), "a").set_outputs("o").build()
    text = _mlp_conf().to_json().replace('"precision": "float32"', json.dumps({"precision": bad})[1:-1])
    with pytest.raises(ValueError, match="precision"):
        MultiLayerConfiguration.from_json(text)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_needs_float32_parameters(precision: str) -> None:
    with pytest.raises(
        ValueError, match=rf"precision: '{precision}' .* needs dtype float32, got dtype float64"
    ):
        _mlp_conf(precision, dtype="float64")
    assert _mlp_conf("float32", dtype="float64").dtype == "float64"


# -- the thread-local GEMM mode ------------------------------------------------------------------------
@needs_mode
def test_the_gemm_precision_binding_round_trips_per_thread() -> None:
    assert _core.cuda_precision() == "float32"
    seen = []
    try:
        for mode in ("bf16", "fp16", "float32", "bf16"):
            _core.cuda_set_precision(mode)
            assert _core.cuda_precision() == mode
        thread = threading.Thread(target=lambda: seen.append(_core.cuda_precision()))
        thread.start()
        thread.join()
    finally:
        _core.cuda_set_precision("float32")
    assert seen == ["float32"]  # another thread keeps its own
    with pytest.raises(ValueError, match=r"\[cuda_set_precision\] expected 'float32', 'bf16' or 'fp16', got"):
        _core.cuda_set_precision("float16")
    assert _core.cuda_precision() == "float32"


@needs_mode
def test_gemm_precision_restores_the_previous_mode() -> None:
    with gemm_precision("bf16"):
        assert _core.cuda_precision() == "bf16"
        with gemm_precision("fp16"):
            assert _core.cuda_precision() == "fp16"
        with pytest.raises(KeyError), gemm_precision("float32"):
            assert _core.cuda_precision() == "float32"
            raise KeyError("an error inside")
        assert _core.cuda_precision() == "bf16"
    assert _core.cuda_precision() == "float32"


class _ModeSpy(EmulatedDevice):
    """The emulated device recording the calling thread's GEMM mode at every gemm call."""

    def __init__(self, on_gemm: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.modes: list[str] = []
        kernels, spy = self.kernels, self

        class Kernels:
            def __getattr__(self, name: str) -> Any:
                f = getattr(kernels, name)
                if name != "gemm":
                    return f

                def gemm(*args: Any, **kwargs: Any) -> Any:
                    spy.modes.append(_core.cuda_precision())
                    on_gemm()
                    return f(*args, **kwargs)

                return gemm

        self.kernels = Kernels()


@needs_mode
@pytest.mark.parametrize("precision", ["bf16", "fp16", "float32"])
def test_a_network_runs_its_gemms_in_its_precision_and_restores_the_mode(precision: str) -> None:
    dev = _ModeSpy()
    net = MultiLayerNetwork(_mlp_conf(precision), device=dev).init()
    batch = _mlp_batches(1)[0]
    with gemm_precision("fp16" if precision == "float32" else "float32"):  # the caller's mode differs
        net.fit(batch)
        net.output(dev.put(batch.features))
        assert _core.cuda_precision() == ("fp16" if precision == "float32" else "float32")
    assert dev.modes and set(dev.modes) == {precision}
    assert _core.cuda_precision() == "float32"


@needs_mode
def test_networks_of_two_precisions_in_two_threads_do_not_interfere() -> None:
    both_inside = threading.Barrier(2, timeout=30)

    def meet(modes: list[str]) -> None:  # at its first gemm each thread waits until the other is inside
        if len(modes) == 1:
            both_inside.wait()

    devices: dict[str, _ModeSpy] = {}
    for p in ("bf16", "fp16"):
        devices[p] = _ModeSpy(lambda p=p: meet(devices[p].modes))  # type: ignore[misc]
    batch = _mlp_batches(1)[0]
    nets = {p: MultiLayerNetwork(_mlp_conf(p), device=dev).init() for p, dev in devices.items()}

    def train(p: str) -> None:
        nets[p].fit(batch)

    threads = [threading.Thread(target=train, args=(p,)) for p in nets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p, dev in devices.items():
        assert dev.modes and set(dev.modes) == {p}
    assert all(n.iteration_count == 1 for n in nets.values())


# -- the CPU ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_on_the_cpu_mixed_precision_warns_once_and_trains_as_float32(precision: str) -> None:
    mixed, plain = MultiLayerNetwork(_mlp_conf(precision)).init(), MultiLayerNetwork(_mlp_conf()).init()
    batches = _mlp_batches()
    with pytest.warns(UserWarning, match=rf"precision '{precision}' has no effect on the CPU") as record:
        mixed.fit(batches[0])
    assert len(record) == 1 and record[0].filename == __file__  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in batches[1:]:
            mixed.fit(batch)
        mixed.output(batches[0].features)
    for batch in batches:
        plain.fit(batch)
    np.testing.assert_array_equal(mixed.params(), plain.params())
    np.testing.assert_array_equal(mixed.updater_state(), plain.updater_state())
    assert mixed.loss_scale == (2.0**16 if precision == "fp16" else None)
    assert mixed.skipped_steps == 0
    assert _core.cuda_precision() == "float32"  # the CPU never touches the mode


# -- the loss scaler -------------------------------------------------------------------------------------
def test_loss_scaler_grows_after_the_interval_and_backs_off_at_each_overflow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scaler = LossScaler()
    assert (scaler.scale, scaler.good_steps, scaler.skipped_steps) == (65536.0, 0, 0)
    for _ in range(1999):
        scaler.update(True)
    assert (scaler.scale, scaler.good_steps) == (65536.0, 1999)
    scaler.update(True)
    assert (scaler.scale, scaler.good_steps) == (131072.0, 0)
    scaler.update(True)
    scaler.update(False)
    scaler.update(False)
    assert (scaler.scale, scaler.good_steps, scaler.skipped_steps) == (32768.0, 0, 2)
    monkeypatch.setattr(_precision, "GROWTH_INTERVAL", 1)
    top = LossScaler(scale=2.0**127)
    top.update(True)  # 2**128 would be inf in float32
    assert top.scale == 2.0**127


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"scale": 0.0, "good_steps": 0, "skipped_steps": 0}, "scale"),
        ({"scale": math.inf, "good_steps": 0, "skipped_steps": 0}, "scale"),
        ({"scale": 1e39, "good_steps": 0, "skipped_steps": 0}, "scale"),
        ({"scale": True, "good_steps": 0, "skipped_steps": 0}, "scale"),
        ({"scale": 2.0, "good_steps": 2000, "skipped_steps": 0}, "good_steps"),
        ({"scale": 2.0, "good_steps": -1, "skipped_steps": 0}, "good_steps"),
        ({"scale": 2.0, "good_steps": 0, "skipped_steps": 1.0}, "skipped_steps"),
        ({"scale": 2.0, "good_steps": 0}, "keys"),
        ([2.0, 0, 0], "keys"),
    ],
)
def test_loss_scaler_state_is_validated(state: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LossScaler.from_state(state)


def _twins(make: Callable[[str], Any], dev: EmulatedDevice) -> tuple[Any, Any]:
    return make("fp16").init().to(dev), make("float32").init().to(dev)


@needs_mode
@pytest.mark.parametrize("kind", ["mlp", "graph"])
def test_fp16_loss_scaling_is_exact_off_the_cpu(kind: str) -> None:
    """The scale is a power of two: scaling the loss gradient and unscaling the flat gradient leave the
    float32 arithmetic of the emulated device bitwise unchanged."""
    dev = EmulatedDevice()
    if kind == "mlp":
        mixed, plain = _twins(lambda p: MultiLayerNetwork(_mlp_conf(p)), dev)
        batches: list[Any] = _mlp_batches()
    else:
        mixed, plain = _twins(lambda p: ComputationGraph(_graph_conf(p)), dev)
        batches = _graph_batches()
    for batch in batches:
        update, score = mixed.compute_update(batch)
        expected_update, expected_score = plain.compute_update(batch)
        assert score == expected_score
        np.testing.assert_array_equal(dev.to_host(update), dev.to_host(expected_update))
        mixed.apply_update(update)
        plain.apply_update(expected_update)
    assert mixed.loss_scale == 2.0**16 and mixed.skipped_steps == 0
    np.testing.assert_array_equal(mixed.params(), plain.params())


@needs_mode
@pytest.mark.parametrize("kind", ["mlp", "graph"])
def test_a_non_finite_fp16_gradient_skips_the_step(kind: str) -> None:
    dev = EmulatedDevice()
    if kind == "mlp":
        mixed, plain = _twins(lambda p: MultiLayerNetwork(_mlp_conf(p)), dev)
        batches: list[Any] = _mlp_batches()
    else:
        mixed, plain = _twins(lambda p: ComputationGraph(_graph_conf(p)), dev)
        batches = _graph_batches()
    mixed.fit(batches[0])
    plain.fit(batches[0])
    params, state = mixed.params().copy(), mixed.updater_state().copy()
    _inject_inf(mixed, {0})
    update, score = mixed.compute_update(batches[1])
    assert math.isfinite(score)
    assert not np.any(dev.to_host(update))  # a zero update: nothing for gradient sharing to encode
    np.testing.assert_array_equal(mixed.params(), params)
    np.testing.assert_array_equal(mixed.updater_state(), state)
    assert (mixed.iteration_count, mixed.skipped_steps, mixed.loss_scale) == (1, 1, 2.0**15)
    # the skipped step left nothing behind: the next one is the float32 network's second step
    for batch in batches[1:]:
        mixed.fit(batch)
        plain.fit(batch)
    np.testing.assert_array_equal(mixed.params(), plain.params())
    np.testing.assert_array_equal(mixed.updater_state(), plain.updater_state())
    assert mixed.iteration_count == plain.iteration_count == len(batches)
    assert (mixed.skipped_steps, mixed.loss_scale) == (1, 2.0**15)


class _Iterations(TrainingListener):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def iteration_done(self, network: Any, iteration: int, epoch: int) -> None:
        self.seen.append(iteration)


@needs_mode
def test_fit_neither_applies_nor_reports_a_skipped_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A skipped step does not count as an iteration (schedules, Adam's bias correction and the
    listeners see only applied updates), as PyTorch's optimizer step count; the scale grows after
    GROWTH_INTERVAL applied steps in a row."""
    monkeypatch.setattr(_precision, "GROWTH_INTERVAL", 2)
    dev = EmulatedDevice()
    net = MultiLayerNetwork(_mlp_conf("fp16")).init().to(dev)
    listener = _Iterations()
    net.set_listeners(listener)
    _inject_inf(net, {1, 2})
    scales = []
    for batch in _mlp_batches(6):
        net.fit(batch)
        scales.append(net.loss_scale)
    assert listener.seen == [1, 2, 3, 4]
    assert (net.iteration_count, net.skipped_steps) == (4, 2)
    assert scales == [2.0**16, 2.0**15, 2.0**14, 2.0**14, 2.0**15, 2.0**15]


@needs_mode
def test_a_skipped_step_leaves_the_float32_residual_of_threshold_encoding_unchanged() -> None:
    dev = EmulatedDevice()
    net = MultiLayerNetwork(_mlp_conf("fp16")).init().to(dev)
    handler = EncodingHandler(net.num_params(), FixedThresholdAlgorithm(1e-3), dtype="float32")
    batches = _mlp_batches(2)
    update, _ = net.compute_update(batches[0])
    assert handler.encode(dev.to_host(update), 0, 0) is not None
    for _ in range(10):  # send what is left above the threshold: the residual is then below it
        if handler.encode(np.zeros(net.num_params(), np.float32), 1, 0) is None:
            break
    residual = handler.residual.copy()
    assert residual.dtype == np.float32 and np.any(residual)
    _inject_inf(net, {0})
    update, _ = net.compute_update(batches[1])
    assert handler.encode(dev.to_host(update), int(net.iteration_count), 0) is None  # nothing encoded
    np.testing.assert_array_equal(handler.residual, residual)


# -- persistence -----------------------------------------------------------------------------------------
def _meta(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read(META_MEMBER))


def _rewrite_meta(path: Path, target: Path, **changes: Any) -> None:
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == META_MEMBER:
                data = json.dumps({**json.loads(data), **changes}).encode()
            dst.writestr(info, data)


@needs_mode
def test_the_loss_scaler_state_is_saved_and_loaded_with_the_updater_state(tmp_path: Path) -> None:
    dev = EmulatedDevice()
    net = MultiLayerNetwork(_mlp_conf("fp16")).init().to(dev)
    batches = _mlp_batches(3)
    net.fit(batches[0])
    _inject_inf(net, {0})
    net.fit(batches[1])
    net.fit(batches[2])
    state = (net.loss_scale, net._loss_scaler.good_steps, net.skipped_steps)
    assert state == (2.0**15, 1, 1)
    net.save(tmp_path / "fp16.zip")
    meta = _meta(tmp_path / "fp16.zip")
    assert meta["format_version"] == 3
    assert meta["loss_scaler"] == {"scale": 32768.0, "good_steps": 1, "skipped_steps": 1}
    back = MultiLayerNetwork.load(tmp_path / "fp16.zip", device=dev)
    assert (back.loss_scale, back._loss_scaler.good_steps, back.skipped_steps) == state
    assert back.iteration_count == 2
    fresh = MultiLayerNetwork.load(tmp_path / "fp16.zip", load_updater=False)
    assert (fresh.loss_scale, fresh.skipped_steps) == (2.0**16, 0)
    clone = net.clone()
    assert (clone.loss_scale, clone._loss_scaler.good_steps, clone.skipped_steps) == state
    clone.fit(batches[0])
    assert net._loss_scaler.good_steps == 1  # the clone's scaler is its own
    # without the updater state, or without a scaler, the file stays version 2 (earlier releases read it)
    net.save(tmp_path / "no_updater.zip", save_updater=False)
    MultiLayerNetwork(_mlp_conf("bf16")).init().save(tmp_path / "bf16.zip")
    for name in ("no_updater.zip", "bf16.zip"):
        assert _meta(tmp_path / name)["format_version"] == 2 and "loss_scaler" not in _meta(tmp_path / name)
    assert MultiLayerNetwork.load(tmp_path / "no_updater.zip").loss_scale == 2.0**16


@needs_mode
@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"loss_scaler": {"scale": -1.0, "good_steps": 0, "skipped_steps": 0}}, "scale must be"),
        ({"loss_scaler": {"scale": 2.0, "good_steps": 0}}, "keys"),
        ({"loss_scaler": None}, "keys"),
        ({"format_version": 2}, "keys"),
    ],
)
def test_a_damaged_loss_scaler_state_is_corrupt_data(tmp_path: Path, changes: dict, match: str) -> None:
    dev = EmulatedDevice()
    net = MultiLayerNetwork(_mlp_conf("fp16")).init().to(dev)
    net.fit(_mlp_batches(1)[0])
    net.save(tmp_path / "good.zip")
    _rewrite_meta(tmp_path / "good.zip", tmp_path / "bad.zip", **changes)
    with pytest.raises(CorruptDataError, match=rf"bad\.zip: {META_MEMBER}: .*{match}"):
        MultiLayerNetwork.load(tmp_path / "bad.zip")


def test_a_loss_scaler_state_without_fp16_is_corrupt_data(tmp_path: Path) -> None:
    MultiLayerNetwork(_mlp_conf("bf16")).init().save(tmp_path / "bf16.zip")
    scaler = {"scale": 2.0, "good_steps": 0, "skipped_steps": 0}
    _rewrite_meta(tmp_path / "bf16.zip", tmp_path / "bad.zip", format_version=3, loss_scaler=scaler)
    with pytest.raises(
        CorruptDataError, match=r"holds a loss-scaler state, but the configuration's precision"
    ):
        MultiLayerNetwork.load(tmp_path / "bad.zip")


# -- a real GPU ------------------------------------------------------------------------------------------
@pytest.fixture
def cp() -> Any:
    return require_gpu()


# unit roundoff of the 16-bit operands (bfloat16: 8 significant bits, float16: 11)
_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_gemm_mode_reaches_cublas(cp: Any, precision: str) -> None:
    """1 + 2**-12 rounds to 1 in bfloat16 and float16 (and TF32, which cuBLAS may also pick): a
    256-term dot product of such operands is 256 in the 16-bit mode and 256.125 (exact) in float32; the
    mode is the calling thread's, and float64 GEMMs ignore it."""
    a = cp.full((256, 256), 1 + 2.0**-12, dtype=cp.float32)
    with gemm_precision(precision):
        rounded = cuda.gemm(a, a)
        results: list[Any] = []
        other = threading.Thread(target=lambda: results.append(cuda.gemm(a, a)))
        other.start()
        other.join()
        double = cuda.gemm(a.astype(cp.float64), a.astype(cp.float64))
    exact = cuda.gemm(a, a)
    np.testing.assert_array_equal(cp.asnumpy(rounded), 256.0)
    np.testing.assert_allclose(cp.asnumpy(exact), 256.125, rtol=0, atol=2.0**-15)  # one float32 ulp
    np.testing.assert_allclose(cp.asnumpy(results[0]), 256.125, rtol=0, atol=2.0**-15)  # another thread
    np.testing.assert_allclose(cp.asnumpy(double), 256 * (1 + 2.0**-12) ** 2, rtol=1e-15)


def _round_to_16_bits(x: np.ndarray, precision: str) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16 (to nearest, ties to even) or float16, as float64."""
    if precision == "fp16":
        return x.astype(np.float16).astype(np.float64)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (False, True), (True, False), (True, True)])
def test_large_products_round_their_operands_to_16_bits(
    cp: Any, precision: str, trans_a: bool, trans_b: bool
) -> None:
    """m = n = 4096 (1/m + 1/n <= 1/2048, cuda/common/blas.cu): both operands are rounded to 16 bits first
    and multiplied with float32 accumulation, so the result is the exact product of the rounded operands
    within float32 summation error (k = 64 terms). 1 + 2**-9, which TF32 keeps, rounds to 1 in bfloat16;
    a float16 operand of 70000 overflows."""
    rng = np.random.default_rng(2)
    m = n = 4096
    k = 64
    a = rng.normal(size=(k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.normal(size=(n, k) if trans_b else (k, n)).astype(np.float32)
    ra, rb = _round_to_16_bits(a, precision), _round_to_16_bits(b, precision)
    ra, rb = (ra.T if trans_a else ra), (rb.T if trans_b else rb)
    with gemm_precision(precision):
        got = cp.asnumpy(cuda.gemm(cp.asarray(a), cp.asarray(b), trans_a=trans_a, trans_b=trans_b))
    bound = k * 2.0**-24 * (np.abs(ra) @ np.abs(rb))
    assert np.all(np.abs(got - ra @ rb) <= bound)
    value = 70000.0 if precision == "fp16" else 1 + 2.0**-9
    with gemm_precision(precision):
        c = cuda.gemm(cp.full((m, k), value, cp.float32), cp.full((k, n), 2.0**-20, cp.float32))
    expected = math.inf if precision == "fp16" else k * 2.0**-20
    assert float(c[0, 0]) == expected and float(c[-1, -1]) == expected


def _gpu_mlp(precision: str) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(256, activation="relu"), DenseLayer(256, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Sgd(0.1),
        weight_init="relu",
        seed=5,
        precision=precision,
    )
    return MultiLayerNetwork(conf, device="cuda:0").init()


def _gpu_batch(seed: int) -> DataSet:
    rng = np.random.default_rng(seed)
    return DataSet(
        rng.random((128, 64), dtype=np.float32), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    )


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_step_scores_close_to_float32(cp: Any, precision: str) -> None:
    """Scores and one SGD step of a 64-256-256-10 MLP against float32 on the same GPU. Operands rounded
    to u (the unit roundoff) make each product's relative error <= 2u; over a reduction of k terms the
    errors add up like a random walk (Higham & Mary 2019: ~ sqrt(k) u with high probability), and each
    of the three layers adds its own: tolerance u * sqrt(k) * 3 relative, k = 256 the longest reduction
    (fan-in 256, batch 128)."""
    batch = _gpu_batch(0)
    mixed, plain = _gpu_mlp(precision), _gpu_mlp("float32")
    rel = _ROUNDOFF[precision] * math.sqrt(256) * 3
    _, score = mixed.compute_gradient_and_score(batch)
    _, expected = plain.compute_gradient_and_score(batch)
    assert abs(score - expected) <= rel * abs(expected)
    start = plain.params()
    mixed.fit(batch)
    plain.fit(batch)
    assert mixed.skipped_steps == 0 and mixed.iteration_count == 1
    step = np.linalg.norm(plain.params() - start)
    assert np.linalg.norm(mixed.params() - plain.params()) <= rel * step
    assert abs(mixed.score(batch) - plain.score(batch)) <= rel * abs(plain.score(batch))
    assert _core.cuda_precision() == "float32"


@pytest.mark.cuda
def test_the_fp16_scaler_skips_a_step_with_an_inf_on_the_gpu(cp: Any) -> None:
    batch = _gpu_batch(1)
    net = _gpu_mlp("fp16")
    net.fit(batch)
    params, iteration = net.params().copy(), net.iteration_count
    _inject_inf(net, {0})
    update, score = net.compute_update(batch)
    assert isinstance(update, cp.ndarray) and not bool(cp.any(update)) and math.isfinite(score)
    np.testing.assert_array_equal(net.params(), params)
    assert (net.iteration_count, net.skipped_steps, net.loss_scale) == (iteration, 1, 2.0**15)
    net.fit(batch)
    assert net.iteration_count == iteration + 1 and np.all(np.isfinite(net.params()))
    assert np.any(net.params() != params)


# Test accuracy of the digits CNN below trained in float32 on the CPU (10 epochs, batch 32, Adam 1e-3,
# seeds 0-9 for the initialisation and the shuffling): mean 0.977, standard deviation 0.005 (min 0.972,
# max 0.986). Three mixed-precision runs must average at least the float32 mean minus three standard
# errors of a three-run mean: 0.977 - 3 * 0.005 / sqrt(3) = 0.968.
_FLOAT32_DIGITS_MEAN, _FLOAT32_DIGITS_STD = 0.977, 0.005


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_digits_cnn_learns_in_mixed_precision_as_in_float32(cp: Any, precision: str) -> None:
    from sparkgrad.datasets import load_digits

    pytest.importorskip("sklearn")
    train, test = load_digits(seed=0, shape="image")
    accuracies = []
    for seed in range(3):
        conf = MultiLayerConfiguration(
            [
                ConvolutionLayer(16, kernel_size=(3, 3), convolution_mode="same", activation="relu"),
                ConvolutionLayer(32, kernel_size=(3, 3), convolution_mode="same", activation="relu"),
                SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
                DenseLayer(128, activation="relu"),
                OutputLayer(10),
            ],
            input_type=InputType.convolutional(8, 8, 1),
            updater=Adam(1e-3),
            weight_init="relu",
            seed=seed,
            precision=precision,
        )
        net = MultiLayerNetwork(conf, device="cuda:0").init()
        for epoch in range(10):
            net.fit(ListDataSetIterator(train, batch_size=32, shuffle=True, seed=1000 * seed + epoch))
        accuracies.append(net.evaluate(test).accuracy())
    print(f"{precision} digits accuracies {accuracies}")
    assert np.mean(accuracies) >= _FLOAT32_DIGITS_MEAN - 3 * _FLOAT32_DIGITS_STD / math.sqrt(3)

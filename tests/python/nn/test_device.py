"""Device-resident training (sparkgrad.device, ``device=`` / ``.to()``) checked on any machine.

The device-independent logic (dispatch, memory ownership, array interop) runs against the emulated device
of ``tests/python/emulated_device.py``: CPU kernels behind the GPU's interface, arrays that refuse to mix
with NumPy arrays, copies across the host boundary counted. Since the kernels are the CPU's, training on it
must give bitwise the CPU's parameters.

The ``cuda`` tests run the same training step on a real GPU (CUDA build + CuPy) and compare with the CPU
within float32 tolerance; they skip elsewhere.
"""

from __future__ import annotations

import functools
import io
import pickle
import re
import types
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from emulated_device import DeviceArray, EmulatedDevice

import sparkgrad.nn
from prerequisites import require_gpu
from sparkgrad import cuda
from sparkgrad import device as devices
from sparkgrad._native import _core
from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.device import CPU, Device, resolve_device
from sparkgrad.nn import (
    GRU,
    LSTM,
    ActivationLayer,
    BatchNormalization,
    Bidirectional,
    CnnToFeedForwardPreProcessor,
    ComputationGraph,
    ComputationGraphConfiguration,
    Convolution1DLayer,
    ConvolutionLayer,
    Cropping2D,
    Deconvolution2D,
    DenseLayer,
    DropoutLayer,
    DuplicateToTimeSeriesVertex,
    ElementWiseVertex,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    InputType,
    L2NormalizeVertex,
    L2Vertex,
    LastTimeStep,
    LastTimeStepVertex,
    LayerNormalization,
    LearnedSelfAttentionLayer,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    PositionEmbeddingLayer,
    PreprocessorVertex,
    ReshapeVertex,
    RnnOutputLayer,
    ScaleVertex,
    SelfAttentionLayer,
    ShiftVertex,
    SimpleRnn,
    StackVertex,
    Subsampling1DLayer,
    SubsamplingLayer,
    SubsetVertex,
    UnstackVertex,
    Upsampling1D,
    Upsampling2D,
    ZeroPadding1DLayer,
    ZeroPaddingLayer,
)
from sparkgrad.nn.listeners import ScoreIterationListener
from sparkgrad.nn.updaters import Adam, Sgd


@pytest.fixture
def emu() -> EmulatedDevice:
    return EmulatedDevice()


# -- networks and data ---------------------------------------------------------------------------
N, T = 6, 5


def _mlp(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            DenseLayer(12, activation="relu", dropout=0.8),
            BatchNormalization(),
            DenseLayer(8, activation="tanh", dropout=0.9),
            DropoutLayer(0.7),
            ActivationLayer("elu"),
            OutputLayer(3),
        ],
        input_type=InputType.feed_forward(7),
        updater=updater or Adam(1e-2),
        l2=1e-3,
        l1=1e-4,
        weight_decay=1e-3,
        seed=11,
    )
    return MultiLayerNetwork(conf)


def _cnn(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(4, kernel_size=(3, 3), activation="relu"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            BatchNormalization(),
            ConvolutionLayer(3, kernel_size=(2, 2), activation="tanh", dropout=0.85),
            GlobalPoolingLayer("avg"),
            OutputLayer(3),
        ],
        input_type=InputType.convolutional(8, 8, 2),
        updater=updater or Adam(1e-2),
        seed=12,
    )
    return MultiLayerNetwork(conf)


def _cnn_bn(updater: Any = None) -> MultiLayerNetwork:
    """Convolution, batch norm and relu: inference folds them into one convolution."""
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(4, kernel_size=(3, 3), activation="identity"),
            BatchNormalization(),
            ActivationLayer("relu"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            OutputLayer(3),
        ],
        input_type=InputType.convolutional(8, 8, 2),
        updater=updater or Adam(1e-2),
        seed=14,
    )
    return MultiLayerNetwork(conf)


def _cnn_copies(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            ZeroPaddingLayer(1),
            ConvolutionLayer(3, kernel_size=(3, 3), activation="relu"),
            Upsampling2D(2),
            Cropping2D((2, 1, 0, 3)),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            OutputLayer(3),
        ],
        input_type=InputType.convolutional(8, 8, 2),
        updater=updater or Adam(1e-2),
        seed=21,
    )
    return MultiLayerNetwork(conf)


def _cnn_deconv(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(
                4, kernel_size=(3, 3), stride=(2, 2), convolution_mode="same", activation="relu"
            ),
            Deconvolution2D(3, kernel_size=(3, 3), stride=(2, 2), convolution_mode="same", activation="tanh"),
            Deconvolution2D(2, kernel_size=(2, 2), dilation=(2, 1), has_bias=False, activation="relu"),
            OutputLayer(3),
        ],
        input_type=InputType.convolutional(8, 8, 2),
        updater=updater or Adam(1e-2),
        seed=22,
    )
    return MultiLayerNetwork(conf)


def _lstm(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [LSTM(5), BatchNormalization(), SimpleRnn(4, activation="tanh"), RnnOutputLayer(2)],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        seed=13,
    )
    return MultiLayerNetwork(conf)


def _gru(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [Bidirectional(GRU(4)), GRU(3, gate_activation="hardtanh"), RnnOutputLayer(2)],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        seed=18,
    )
    return MultiLayerNetwork(conf)


def _conv1d(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            Convolution1DLayer(4, kernel_size=2, stride=2, activation="relu"),
            Subsampling1DLayer("avg", kernel_size=2, stride=1),
            Upsampling1D(2),
            ZeroPadding1DLayer(1),
            GlobalPoolingLayer("max"),
            OutputLayer(2),
        ],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        seed=20,
    )
    return MultiLayerNetwork(conf)


def _lstm_tbptt(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [LSTM(3), SimpleRnn(2, activation="tanh"), RnnOutputLayer(2)],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        backprop_type="truncated_bptt",
        tbptt_forward_length=2,
        tbptt_backward_length=2,
        seed=19,
    )
    return MultiLayerNetwork(conf)


def _lstm_to_vector(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [Bidirectional(LSTM(3)), LastTimeStep(LSTM(3)), OutputLayer(2)],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        seed=14,
    )
    return MultiLayerNetwork(conf)


def _lstm_pooled(updater: Any = None) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            Bidirectional(SimpleRnn(3, activation="tanh"), mode="add"),
            GlobalPoolingLayer("max"),
            OutputLayer(2),
        ],
        input_type=InputType.recurrent(3),
        updater=updater or Adam(1e-2),
        seed=15,
    )
    return MultiLayerNetwork(conf)


def _embedding(updater: Any = None, lazy: bool = False) -> MultiLayerNetwork:
    # the table trains row-sparsely (its own Sgd, or lazily the network's updater), the rest with the
    # network's updater
    conf = MultiLayerConfiguration(
        [
            EmbeddingSequenceLayer(
                11, 4, has_bias=True, updater=None if lazy else Sgd(0.2), lazy_updates=lazy
            ),
            LSTM(3),
            RnnOutputLayer(2),
        ],
        input_type=InputType.recurrent(1),
        updater=updater or Adam(1e-2),
        seed=17,
    )
    return MultiLayerNetwork(conf)


def _graph(updater: Any = None) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=16, updater=updater or Adam(1e-2), l2=1e-3)
        .add_inputs("a", "b")
        .set_input_types(InputType.feed_forward(5), InputType.feed_forward(4))
        .add_layer("da", DenseLayer(6, activation="relu", dropout=0.8), "a")
        .add_layer("db", DenseLayer(6, activation="tanh"), "b")
        .add_vertex("merge", MergeVertex(), "da", "db")
        .add_vertex("sub", SubsetVertex(2, 7), "merge")
        .add_vertex("sum", ElementWiseVertex("add"), "sub", "da")
        .add_vertex("norm", L2NormalizeVertex(), "sum")
        .add_layer("bn", BatchNormalization(), "merge")
        .add_layer("out", OutputLayer(3), "norm", "bn")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf)


def _transformer(updater: Any = None) -> ComputationGraph:
    """The attention layers: positions, self-attention with a residual and layer norm, learned queries."""
    conf = (
        ComputationGraphConfiguration.builder(seed=19, updater=updater or Adam(1e-2))
        .add_inputs("seq")
        .set_input_types(InputType.recurrent(3))
        .add_layer("pos", PositionEmbeddingLayer(T), "seq")
        .add_layer("attention", SelfAttentionLayer(3, n_heads=2, head_size=2), "pos")
        .add_vertex("residual", ElementWiseVertex("add"), "pos", "attention")
        .add_layer("norm", LayerNormalization(), "residual")
        .add_layer("ff", DenseLayer(4, activation="relu"), "norm")
        .add_layer("summary", LearnedSelfAttentionLayer(4, n_queries=2, n_heads=2), "ff")
        .add_layer("pool", GlobalPoolingLayer("avg"), "summary")
        .add_layer("out", OutputLayer(2), "pool")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf)


def _vertex_graph(updater: Any = None) -> ComputationGraph:
    """The other feed-forward vertices: element-wise product and max, stack/unstack, scale, shift, L2
    distance, reshape and a preprocessor."""
    conf = (
        ComputationGraphConfiguration.builder(seed=18, updater=updater or Adam(1e-2))
        .add_inputs("x", "y")
        .set_input_types(InputType.feed_forward(6), InputType.feed_forward(6))
        .add_layer("dx", DenseLayer(6, activation="tanh"), "x")
        .add_vertex("product", ElementWiseVertex("product"), "dx", "y", "dx")
        .add_vertex("max", ElementWiseVertex("max"), "dx", "y")
        .add_vertex("stack", StackVertex(), "dx", "y")
        .add_layer("ds", DenseLayer(6, activation="sigmoid"), "stack")
        .add_vertex("first", UnstackVertex(0, 2), "ds")
        .add_vertex("second", UnstackVertex(1, 2), "ds")
        .add_vertex("scaled", ScaleVertex(-2.0), "second")
        .add_vertex("shifted", ShiftVertex(0.25), "scaled")
        .add_vertex("dist", L2Vertex(), "first", "max")
        .add_vertex("image", ReshapeVertex((3, 1, 2)), "product")
        .add_vertex("rows", PreprocessorVertex(CnnToFeedForwardPreProcessor()), "image")
        .add_layer("out", OutputLayer(3), "shifted", "dist", "rows")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf)


def _recurrent_graph(updater: Any = None) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=17, updater=updater or Adam(1e-2))
        .add_inputs("seq", "ctx")
        .set_input_types(InputType.recurrent(3), InputType.feed_forward(2))
        .add_vertex("dup", DuplicateToTimeSeriesVertex("seq"), "ctx")
        .add_layer("lstm", LSTM(4), "seq", "dup")  # an implicit per-step MergeVertex
        .add_vertex("sub", SubsetVertex(0, 1), "seq")
        .add_vertex("merge", MergeVertex(), "lstm", "sub")
        .add_layer("steps", RnnOutputLayer(2), "merge")
        .add_layer("last", LastTimeStep(SimpleRnn(3, activation="tanh")), "lstm")
        .add_vertex("last_step", LastTimeStepVertex("seq"), "lstm")
        .add_layer("vec", OutputLayer(2), "last", "last_step")
        .set_outputs("steps", "vec")
        .build()
    )
    return ComputationGraph(conf)


def _one_hot(rng: np.random.Generator, shape: tuple, classes: int, axis: int = 1) -> np.ndarray:
    hot = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, shape)]
    return np.moveaxis(hot, -1, axis)


def _lengths_mask(rng: np.random.Generator) -> np.ndarray:
    lengths = rng.integers(1, T + 1, N)
    lengths[0] = T
    return (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)


def _batches(name: str, seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for _ in range(3):
        if name == "mlp":
            out.append(DataSet(rng.normal(size=(N, 7)).astype(np.float32), _one_hot(rng, (N,), 3)))
        elif name in ("cnn", "cnn_bn", "cnn_copies", "cnn_deconv"):
            out.append(DataSet(rng.normal(size=(N, 2, 8, 8)).astype(np.float32), _one_hot(rng, (N,), 3)))
        elif name in ("lstm", "lstm_tbptt", "gru"):
            fmask = _lengths_mask(rng)
            lmask = fmask * (rng.random((N, T)) < 0.8)
            x = rng.normal(size=(N, 3, T)).astype(np.float32)
            out.append(DataSet(x, _one_hot(rng, (N, T), 2), features_mask=fmask, labels_mask=lmask))
        elif name == "transformer":
            x = rng.normal(size=(N, 3, T)).astype(np.float32)
            out.append(MultiDataSet([x], [_one_hot(rng, (N,), 2)], features_masks=[_lengths_mask(rng)]))
        elif name in ("lstm_to_vector", "lstm_pooled", "conv1d"):
            x = rng.normal(size=(N, 3, T)).astype(np.float32)
            out.append(DataSet(x, _one_hot(rng, (N,), 2), features_mask=_lengths_mask(rng)))
        elif name in ("graph", "vertex_graph"):
            xa = rng.normal(size=(N, 5 if name == "graph" else 6)).astype(np.float32)
            xb = rng.normal(size=(N, 4 if name == "graph" else 6)).astype(np.float32)
            out.append(MultiDataSet([xa, xb], [_one_hot(rng, (N,), 3)]))
        elif name in ("embedding", "embedding_lazy"):
            fmask = _lengths_mask(rng)
            x = rng.integers(0, 11, (N, 1, T)) * fmask[:, None, :].astype(np.int64)  # padded with 0
            out.append(DataSet(x, _one_hot(rng, (N, T), 2), features_mask=fmask))
        else:  # recurrent graph
            x = rng.normal(size=(N, 3, T)).astype(np.float32)
            ctx = rng.normal(size=(N, 2)).astype(np.float32)
            fmask = _lengths_mask(rng)
            labels = [_one_hot(rng, (N, T), 2), _one_hot(rng, (N,), 2)]
            out.append(MultiDataSet([x, ctx], labels, features_masks=[fmask, None]))
    return out


NETWORKS: dict[str, Callable[[], Any]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "cnn_bn": _cnn_bn,
    "cnn_copies": _cnn_copies,
    "cnn_deconv": _cnn_deconv,
    "lstm": _lstm,
    "lstm_tbptt": _lstm_tbptt,
    "gru": _gru,
    "conv1d": _conv1d,
    "lstm_to_vector": _lstm_to_vector,
    "lstm_pooled": _lstm_pooled,
    "graph": _graph,
    "vertex_graph": _vertex_graph,
    "recurrent_graph": _recurrent_graph,
    "transformer": _transformer,
    "embedding": _embedding,
    "embedding_lazy": functools.partial(_embedding, lazy=True),
}


def _arrays_everywhere(net: Any, kind: type) -> None:
    """Every array the network holds (flat buffers, views, work buffers, activations, runtime state) is
    of type ``kind``: DeviceArray on the emulated device, np.ndarray on the CPU."""
    for buffer in (net._params, net._grad, net._state):
        assert type(buffer) is kind
    seen: set[int] = set()
    found = 0

    def visit(value: Any, path: str) -> None:
        nonlocal found
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, (np.ndarray, DeviceArray)):
            found += 1
            assert type(value) is kind, f"{path} is a {type(value).__name__}"
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{path}[{k!r}]")
        elif isinstance(value, (list, tuple)):
            for k, v in enumerate(value):
                visit(v, f"{path}[{k}]")
        elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, Device)):
            for k, v in vars(value).items():
                if k not in ("conf", "input_type", "input_types", "layer"):
                    visit(v, f"{path}.{k}")

    runtimes = [node.runtime for node in net._nodes] if hasattr(net, "_nodes") else net._runtimes
    for i, rt in enumerate(runtimes):
        visit(rt, f"runtime {i}")
    visit(getattr(net, "_sum_buffers", {}), "sum buffers")
    assert found > len(runtimes)  # the walk did reach the buffers


# -- resolve_device -------------------------------------------------------------------------------
def test_resolve_device_names_and_passes_devices_through(emu: EmulatedDevice) -> None:
    assert resolve_device("cpu") is CPU
    assert CPU.name == "cpu" and CPU.xp is np and CPU.kernels is _core
    assert resolve_device(emu) is emu
    for spec in ("gpu", "cuda:", "cuda:-1", "CUDA", "cuda:0:1", " cpu", "cuda0", "cpu:0"):
        with pytest.raises(ValueError, match="device: expected 'cpu', 'cuda' or 'cuda:N'"):
            resolve_device(spec)
    with pytest.raises(TypeError, match="device: expected"):
        resolve_device(0)


@pytest.mark.skipif(cuda.built(), reason="this build has CUDA")
def test_cuda_without_a_cuda_build_is_a_clear_error() -> None:
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(RuntimeError, match=r"built without CUDA.*SPARKGRAD_ENABLE_CUDA=ON"):
            resolve_device(spec)
    with pytest.raises(RuntimeError, match="'cuda:0': sparkgrad was built without CUDA"):
        MultiLayerNetwork(_mlp().conf, device="cuda:0")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        _graph().to("cuda")


def test_cuda_errors_say_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy missing, and a GPU index the runtime does not see (a CUDA build is faked)."""
    monkeypatch.setattr(cuda, "built", lambda: True)
    devices._cuda_device.cache_clear()
    try:
        monkeypatch.setitem(__import__("sys").modules, "cupy", None)  # import cupy raises ImportError
        with pytest.raises(RuntimeError, match=r"'cuda:0': GPU arrays need CuPy.*pip install cupy-cuda13x"):
            resolve_device("cuda:0")
        monkeypatch.setitem(__import__("sys").modules, "cupy", types.ModuleType("cupy"))
        gpu = cuda.GpuInfo(0, "fake", (9, 0), 2**30)
        monkeypatch.setattr(cuda, "devices", lambda: [gpu])
        with pytest.raises(RuntimeError, match=r"'cuda:1': no such GPU, the CUDA runtime sees GPUs 0\.\.0"):
            resolve_device("cuda:1")
        monkeypatch.setattr(cuda, "devices", lambda: [])
        with pytest.raises(RuntimeError, match="'cuda:0': no such GPU, the CUDA runtime sees no GPU"):
            resolve_device("cuda")
    finally:
        devices._cuda_device.cache_clear()


def test_gpu_arrays_are_recognised_in_one_place() -> None:
    """Only sparkgrad.device.is_gpu_array asks whether an object is a GPU array; everything else calls it
    (copies had drifted: some missed DLPack producers, so a GPU array read as a host one)."""
    package = Path(devices.__file__).resolve().parent
    probe = re.compile(r"hasattr\(\s*\w+\s*,\s*[\"']__(cuda_array_interface|dlpack_device)__")
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if probe.search(line) and path.name != "device.py"
    ]
    assert found == []


def test_a_cpu_network_refuses_gpu_arrays_clearly() -> None:
    class GpuArray:  # what a network sees of a CuPy array without a GPU
        __cuda_array_interface__ = {"shape": (2, 7), "typestr": "<f4", "data": (0x10000, False), "version": 3}

    class DlpackGpuArray:  # a DLPack producer on a CUDA device (kDLCUDA = 2)
        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

    assert devices.is_gpu_array(GpuArray()) and devices.is_gpu_array(DlpackGpuArray())
    assert not devices.is_gpu_array(np.ones(2)) and not devices.is_gpu_array([1.0])
    net = _mlp().init()
    with pytest.raises(TypeError, match=r"GPU array \(DlpackGpuArray\) was given to a network on cpu"):
        net.set_params(DlpackGpuArray())
    with pytest.raises(
        TypeError, match=r"GPU array \(GpuArray\) was given to a network on cpu.*\.to\('cuda:N'\)"
    ):
        net.output(GpuArray())


@pytest.mark.parametrize("name", ["lstm_tbptt", "cnn"])
def test_unpickled_and_strided_inputs_train_like_the_originals(name: str) -> None:
    """An unpickled array (what a Spark worker gets) has a dtype object of its own, which a copy keeps
    (truncated BPTT cuts strided time windows); the kernels still get the network dtype."""
    batches = _batches(name)
    reference = NETWORKS[name]().init().fit(batches)
    unpickled = pickle.loads(pickle.dumps(batches))
    assert unpickled[0].features.dtype is not np.dtype(np.float32)
    net = NETWORKS[name]().init().fit(unpickled)
    np.testing.assert_array_equal(net.params(), reference.params())
    wide = pickle.loads(pickle.dumps(np.repeat(batches[0].features, 2, axis=-1)))
    np.testing.assert_array_equal(net.output(wide[..., ::2]), net.output(batches[0].features))


def test_layers_reach_the_kernels_only_through_their_device() -> None:
    """A direct ``_core`` kernel call in sparkgrad.nn would bypass the Device: the native kernels take any
    device's arrays, but a stand-in device (the emulated one, whose checks are the only ones that see a
    host array or a call outside the device's scope) could not tell. Only host-side queries may remain (and
    the calling thread's GEMM precision, which takes no array)."""
    calls = set()
    for path in Path(sparkgrad.nn.__file__).parent.glob("*.py"):
        calls |= set(re.findall(r"\b_core\.(\w+)\(", path.read_text()))
    assert calls == {"updater_state_size", "cuda_precision", "cuda_set_precision"}


# -- memory ownership and bitwise equality with the CPU ---------------------------------------------
@pytest.mark.parametrize("name", list(NETWORKS))
def test_training_on_the_device_is_bitwise_the_cpu_training(emu: EmulatedDevice, name: str) -> None:
    batches = _batches(name)
    reference = NETWORKS[name]().init()
    reference.fit(batches)
    net = NETWORKS[name]().init().to(emu)
    assert net.device is emu
    net.fit(batches)
    _arrays_everywhere(net, DeviceArray)
    np.testing.assert_array_equal(net.params(), reference.params())
    np.testing.assert_array_equal(net.updater_state(), reference.updater_state())
    assert net.score() == reference.score()
    assert net.iteration_count == reference.iteration_count >= 3  # truncated BPTT: one per segment
    test = batches[0]
    assert net.score(test) == reference.score(test)
    np.testing.assert_array_equal(net.score_examples(test), reference.score_examples(test))
    assert type(net.score_examples(test)) is np.ndarray


@pytest.mark.parametrize("name", ["mlp", "lstm", "graph"])
def test_a_network_built_on_the_device_matches_one_moved_there(emu: EmulatedDevice, name: str) -> None:
    batches = _batches(name)
    moved = NETWORKS[name]().init().to(emu).fit(batches)
    built = type(moved)(moved.conf, device=emu).init().fit(batches)
    _arrays_everywhere(built, DeviceArray)
    np.testing.assert_array_equal(built.params(), moved.params())


@pytest.mark.parametrize("name", list(NETWORKS))
def test_output_returns_the_kind_of_array_it_was_given(emu: EmulatedDevice, name: str) -> None:
    batch = _batches(name)[0]
    reference = NETWORKS[name]().init()
    net = NETWORKS[name]().init().to(emu)
    if isinstance(batch, MultiDataSet):
        masks = batch.features_masks
        expected = reference.output(*batch.features, features_masks=masks)
        from_host = net.output(*batch.features, features_masks=masks)
        dev_masks = None if masks is None else [emu.put(m) for m in masks]
        from_device = net.output(*[emu.put(x) for x in batch.features], features_masks=dev_masks)
    else:
        expected = [reference.output(batch.features, features_mask=batch.features_mask)]
        from_host = [net.output(batch.features, features_mask=batch.features_mask)]
        from_device = [net.output(emu.put(batch.features), features_mask=emu.put(batch.features_mask))]
    for want, host, dev in zip(expected, from_host, from_device):
        assert type(host) is np.ndarray
        assert type(dev) is DeviceArray
        np.testing.assert_array_equal(host, want)
        np.testing.assert_array_equal(emu.peek(dev), want)


def test_a_foreign_gpu_array_gets_a_device_array_back(emu: EmulatedDevice, monkeypatch) -> None:
    """A GPU array of another library (PyTorch, Numba: ``__cuda_array_interface__`` or DLPack) is taken
    through ``from_gpu`` and the output stays on the device, as for the device's own arrays."""

    class ForeignGpuArray:  # another library's GPU array; the emulated device reads its host mirror
        def __init__(self, host: np.ndarray) -> None:
            self.host = host
            self.__cuda_array_interface__ = {"shape": host.shape, "typestr": "<f4", "version": 3}

    monkeypatch.setattr(emu, "from_gpu", lambda arr: emu.put(arr.host), raising=False)
    x = np.random.default_rng(5).normal(size=(N, 7)).astype(np.float32)
    net = _mlp().init().to(emu)
    out = net.output(ForeignGpuArray(x))
    assert type(out) is DeviceArray
    np.testing.assert_array_equal(emu.peek(out), _mlp().init().output(x))


def test_rnn_time_step_on_the_device_matches_the_cpu(emu: EmulatedDevice) -> None:
    x = np.random.default_rng(3).normal(size=(N, 3, T)).astype(np.float32)
    reference, net = _lstm().init(), _lstm().init().to(emu)
    for t in range(T):
        want = reference.rnn_time_step(x[:, :, t])
        np.testing.assert_array_equal(net.rnn_time_step(x[:, :, t]), want)
    reference.rnn_clear_previous_state()
    net.rnn_clear_previous_state()
    dev = net.rnn_time_step(emu.put(x))
    assert type(dev) is DeviceArray
    np.testing.assert_array_equal(emu.peek(dev), reference.rnn_time_step(x))


# -- copies across the host boundary ---------------------------------------------------------------
@pytest.mark.parametrize(("name", "arrays"), [("mlp", 2), ("lstm", 4), ("graph", 3), ("recurrent_graph", 5)])
def test_a_fit_step_copies_only_its_host_inputs_to_the_device(
    emu: EmulatedDevice, name: str, arrays: int
) -> None:
    """Each host array of a minibatch crosses once; nothing comes back but the scalar score (listeners
    included), and device inputs cross nothing."""
    batches = _batches(name)
    net = NETWORKS[name]().init().to(emu)
    net.set_listeners(ScoreIterationListener(1))
    for batch in batches:
        emu.reset_counts()
        net.fit(batch)
        assert (emu.uploads, emu.downloads) == (arrays, 0)
    reference = NETWORKS[name]().init().fit(batches)
    batch = _batches(name, seed=1)[0]
    if isinstance(batch, MultiDataSet):
        on_device = types.SimpleNamespace(
            features=[emu.put(x) for x in batch.features],
            labels=[emu.put(y) for y in batch.labels],
            features_masks=[emu.put(m) for m in batch.features_masks or []],
            labels_masks=None,
        )
    else:
        on_device = types.SimpleNamespace(
            features=emu.put(batch.features),
            labels=emu.put(batch.labels),
            features_mask=emu.put(batch.features_mask),
            labels_mask=emu.put(batch.labels_mask),
        )
    emu.reset_counts()
    update, score = net.compute_update(on_device)
    assert (emu.uploads, emu.downloads) == (0, 0)
    assert type(update) is DeviceArray
    want_update, want_score = reference.compute_update(batch)
    np.testing.assert_array_equal(emu.peek(update), want_update)
    assert score == want_score
    net.apply_update(update)
    reference.apply_update(want_update)
    assert (emu.uploads, emu.downloads) == (0, 0)
    emu.reset_counts()
    net.apply_update(want_update)  # a host update crosses once
    reference.apply_update(want_update)
    assert (emu.uploads, emu.downloads) == (1, 0)
    np.testing.assert_array_equal(net.params(), reference.params())


def test_host_accessors_copy_once_and_write_back(emu: EmulatedDevice) -> None:
    net = _mlp().init().to(emu).fit(_batches("mlp"))
    emu.reset_counts()
    params, state = net.params(), net.updater_state()
    assert type(params) is np.ndarray and type(state) is np.ndarray
    assert (emu.uploads, emu.downloads) == (0, 2)
    params[:] = 0.5  # a copy: the network is unchanged until set_params
    assert not np.array_equal(net.params(), params)
    emu.reset_counts()
    net.set_params(params)
    net.set_updater_state(state * 2)
    assert (emu.uploads, emu.downloads) == (2, 0)
    np.testing.assert_array_equal(net.params(), params)
    np.testing.assert_array_equal(net.updater_state(), state * 2)
    with pytest.raises(ValueError, match="params: expected a flat vector of length"):
        net.set_params(params[:-1])
    with pytest.raises(ValueError, match="update: expected a flat vector of length"):
        net.apply_update(emu.put(params[:-1]))


# -- moving, cloning and saving --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "graph"])
def test_to_cpu_round_trips_exactly_and_training_continues_the_same(emu: EmulatedDevice, name: str) -> None:
    batches = _batches(name)
    reference = NETWORKS[name]().init().fit(batches)
    net = NETWORKS[name]().init().fit(batches)
    params, state = net.params().copy(), net.updater_state().copy()
    emu.reset_counts()
    assert net.to(emu) is net
    assert (emu.uploads, emu.downloads) == (3, 0)  # parameters, gradient, updater state
    assert net.to(emu) is net and emu.uploads == 3  # already there: nothing moves
    net.fit(batches)
    reference.fit(batches)
    emu.reset_counts()
    assert net.to("cpu") is net
    assert net.device is CPU
    assert (emu.uploads, emu.downloads) == (0, 3)
    _arrays_everywhere(net, np.ndarray)
    np.testing.assert_array_equal(net.params(), reference.params())
    np.testing.assert_array_equal(net.updater_state(), reference.updater_state())
    net.fit(batches)
    reference.fit(batches)
    np.testing.assert_array_equal(net.params(), reference.params())
    assert not np.array_equal(net.params(), params) and not np.array_equal(net.updater_state(), state)


def test_to_before_init_places_the_buffers_at_init(emu: EmulatedDevice) -> None:
    net = _mlp().to(emu)
    assert net.device is emu
    emu.reset_counts()
    net.init()
    assert emu.uploads == 1  # the initial parameters, drawn on the host
    _arrays_everywhere(net, DeviceArray)
    np.testing.assert_array_equal(net.params(), _mlp().init().params())


@pytest.mark.parametrize("name", ["mlp", "recurrent_graph"])
def test_clone_save_and_load_keep_working_on_the_device(
    emu: EmulatedDevice, tmp_path: Any, name: str
) -> None:
    batches = _batches(name)
    reference = NETWORKS[name]().init().fit(batches)
    net = NETWORKS[name]().init().to(emu).fit(batches)
    twin = net.clone()
    assert twin.device is emu
    _arrays_everywhere(twin, DeviceArray)
    np.testing.assert_array_equal(twin.params(), reference.params())
    saved, expected = io.BytesIO(), io.BytesIO()
    net.save(saved)
    reference.save(expected)
    assert saved.getvalue() == expected.getvalue()  # the same file, byte for byte
    saved.seek(0)
    loaded = type(net).load(saved, device=emu)
    assert loaded.device is emu
    _arrays_everywhere(loaded, DeviceArray)
    np.testing.assert_array_equal(loaded.params(), reference.params())
    np.testing.assert_array_equal(loaded.updater_state(), reference.updater_state())
    loaded.fit(batches)
    reference.fit(batches)
    np.testing.assert_array_equal(loaded.params(), reference.params())


def test_evaluation_on_the_device_matches_the_cpu(emu: EmulatedDevice) -> None:
    batches = _batches("lstm")
    reference = _lstm().init().fit(batches)
    net = _lstm().init().to(emu).fit(batches)
    got, want = net.evaluate(batches), reference.evaluate(batches)
    assert got.accuracy() == want.accuracy()
    np.testing.assert_array_equal(got.confusion_matrix(), want.confusion_matrix())
    graph_batches = _batches("graph")
    graph_ref = _graph().init().fit(graph_batches)
    graph = _graph().init().to(emu).fit(graph_batches)
    assert graph.evaluate(graph_batches).accuracy() == graph_ref.evaluate(graph_batches).accuracy()


def test_non_finite_training_error_names_the_input_on_the_device(emu: EmulatedDevice) -> None:
    from sparkgrad.errors import TrainingError

    batch = _batches("mlp")[0]
    x = batch.features.copy()
    x[2, 3] = np.nan
    net = _mlp().init().to(emu)
    before = net.params()
    with pytest.raises(TrainingError, match=r"first non-finite input: features\[2, 3\] = nan"):
        net.fit(DataSet(x, batch.labels))
    np.testing.assert_array_equal(net.params(), before)


# -- a real GPU --------------------------------------------------------------------------------------
@pytest.fixture
def cp() -> Any:
    return require_gpu()


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(NETWORKS))
def test_a_training_step_on_the_gpu_matches_the_cpu(cp: Any, name: str) -> None:
    """One SGD step from the same parameters: the GPU's parameters within float32 tolerance of the
    CPU's. The gradient sums at most ``terms`` products (the longest reduction: batch x steps x the
    widest fan-in), each rounding by eps, so the update differs by at most lr * terms * eps * the sum of
    the magnitudes, bounded here by the largest gradient entry times the reduction length. SGD keeps the
    update lr * gradient (Adam would divide tiny gradient differences by tiny second moments)."""
    batch = _batches(name)[0]
    cpu_net = NETWORKS[name](Sgd(0.1)).init()
    gpu_net = NETWORKS[name](Sgd(0.1)).init().to("cuda:0")
    assert gpu_net.device.name == "cuda:0"
    assert isinstance(gpu_net._params, cp.ndarray)
    # a truncated-BPTT network takes its gradient over one segment at a time
    part = cpu_net.tbptt_segments(batch)[0] if name == "lstm_tbptt" else batch
    grad_cpu, score_cpu = cpu_net.compute_gradient_and_score(part)
    grad_gpu, score_gpu = gpu_net.compute_gradient_and_score(part)
    assert isinstance(grad_gpu, cp.ndarray)
    eps = np.finfo(np.float32).eps
    terms = N * T * max(spec.shape[0] for _, layer, it in cpu_net._units for spec in layer.param_specs(it))
    tol = 16 * terms * eps * float(np.abs(grad_cpu).max())
    np.testing.assert_allclose(cp.asnumpy(grad_gpu), grad_cpu, rtol=0, atol=tol)
    assert abs(score_gpu - score_cpu) <= 16 * terms * eps * abs(score_cpu)
    cpu_net.fit(batch)
    gpu_net.fit(batch)
    params = gpu_net.params()
    np.testing.assert_allclose(params, cpu_net.params(), rtol=0, atol=0.1 * tol + 16 * eps)
    if isinstance(batch, MultiDataSet):
        outs = gpu_net.output(*[cp.asarray(x) for x in batch.features])
        want = cpu_net.output(*batch.features)
    else:
        outs = [gpu_net.output(cp.asarray(batch.features))]
        want = [cpu_net.output(batch.features)]
    for got, expected in zip(outs, want):
        assert isinstance(got, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(got), expected, rtol=0, atol=tol)
    assert gpu_net.to("cpu").device is CPU
    np.testing.assert_array_equal(gpu_net.params(), params)

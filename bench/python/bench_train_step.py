"""Training-step time of sparkgrad vs PyTorch, on the CPU (same thread count) or on a GPU, in the same run.

Configurations (Adam, softmax + cross-entropy, random data):
  mlp:   784-1024-512-10 (relu), batch 128
  lenet: 28x28x1 -> conv 20 5x5 -> maxpool 2 -> conv 50 5x5 -> maxpool 2 -> dense 500 relu -> softmax 10,
         batch 64
  resnet: a residual CNN (ComputationGraph): 28x28x1 -> conv 16 3x3 relu -> [conv 16 3x3 relu -> conv 16
         3x3 -> add the block input -> relu] -> maxpool 2 -> conv 32 3x3 relu -> [the same block with 32
         channels] -> maxpool 2 -> softmax 10, all convolutions "same"; batch 64
  lstm:  the LSTM of bench_lstm.py: input 64, hidden 256, 50 time steps, softmax 10 at the last step, batch 64
  gru:   the same with a GRU (PyTorch's nn.GRU applies the reset gate after its recurrent product, DL4J's
         GRU before: the same work in two products per step)
  conv1d: a 1-D CNN over time series: 16 channels x 128 steps -> conv1d 64 k5 relu -> maxpool 2 -> conv1d
         64 k3 relu -> global max pool -> softmax 10; batch 64
  transformer: a transformer encoder block (ComputationGraph) over 64 steps of 64 features: + learned
         position embedding -> self-attention (4 heads of 16, projected, no bias) -> residual add ->
         layer norm -> dense 128 relu -> dense 64 -> residual add -> layer norm -> average over time ->
         softmax 10; batch 64 (PyTorch: nn.MultiheadAttention(bias=False), nn.LayerNorm, nn.Linear)
  deconv: a DCGAN-style upsampling stack: 7x7x32 -> Deconvolution2D 32 4x4 stride 2 padding 1 relu (14x14)
         -> Deconvolution2D 16 4x4 stride 2 padding 1 relu (28x28) -> softmax 10; batch 64 (PyTorch:
         ConvTranspose2d, whose weight layout (in, out, kH, kW) is DL4J's too)
The realistic sizes of issue 42 (selected with --models; their GEMMs are large enough for the tensor
cores to matter):
  mlp_large:  1024-4096-4096-10 (relu), batch 1024
  vgg:        32x32x3 -> two conv 64 3x3 relu -> maxpool 2 -> two conv 128 3x3 relu -> maxpool 2 -> dense 256
              relu -> softmax 10, all convolutions "same"; batch 256
  lstm_large: LSTM input 256, hidden 512, 64 time steps, softmax 10 at the last step, batch 256

Prints three lines per configuration: the median and the minimum wall time over the rounds, and the
minimum process CPU time (all threads), each as ms/step for both and the ratio sparkgrad / PyTorch
(targets: <= 1.0 for the MLP and the residual CNN, <= 1.5 for LeNet). Rounds alternate between the two
frameworks so that machine load hits both; on a shared machine the minima, and the CPU time most of all
(it does not count time spent descheduled), estimate each framework's unloaded speed.

``--device cuda`` trains both on GPU 0 (sparkgrad: ``device="cuda:0"``; PyTorch: ``.cuda()``): each step
copies the host minibatch to the GPU in both, and every timed round ends with a device synchronisation.
Only the wall-time lines are printed there (the CPU time of a GPU step says nothing). Both compute in
float32: PyTorch's convolutions would otherwise run in TF32 on the tensor cores (cuDNN's default), a
10-bit mantissa; ``--torch-tf32`` keeps that default, to show what it buys. It stops with a
message saying what is missing when there is no usable GPU (sparkgrad built without CUDA, no CuPy, no
GPU, or a CPU-only PyTorch).

``--precision bf16|fp16`` (GPU only) trains in mixed precision: sparkgrad with the configuration's
``precision`` (tensor-core GEMMs, float32 buffers; fp16 with its dynamic loss scaling), PyTorch under
``torch.autocast(device_type="cuda", dtype=torch.bfloat16 / torch.float16)``, fp16 with
``torch.amp.GradScaler``; both keep float32 master weights and optimizer state (target: sparkgrad <=
1.0x PyTorch's step time).

    PYTHONPATH=python python bench/python/bench_train_step.py [--device cpu|cuda] [--threads N] \
        [--steps 20] [--rounds 5] \
        [--models mlp,lenet,resnet,lstm,gru,conv1d,transformer,deconv,mlp_large,vgg,lstm_large] \
        [--precision float32|bf16|fp16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.device import Device, resolve_device
from sparkgrad.nn import (
    GRU,
    LSTM,
    ActivationLayer,
    ComputationGraph,
    ComputationGraphConfiguration,
    Convolution1DLayer,
    ConvolutionLayer,
    Deconvolution2D,
    DenseLayer,
    ElementWiseVertex,
    GlobalPoolingLayer,
    GraphBuilder,
    InputType,
    LastTimeStep,
    LayerNormalization,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    PositionEmbeddingLayer,
    SelfAttentionLayer,
    Subsampling1DLayer,
    SubsamplingLayer,
    updaters,
)

# (batch, input shape: features, (channels, height, width) or (size, time steps)) of every model
MODELS = {
    "mlp": (128, (784,)),
    "lenet": (64, (1, 28, 28)),
    "resnet": (64, (1, 28, 28)),
    "lstm": (64, (64, 50)),
    "gru": (64, (64, 50)),
    "conv1d": (64, (16, 128)),
    "transformer": (64, (64, 64)),
    "deconv": (64, (32, 7, 7)),
    "mlp_large": (1024, (1024,)),
    "vgg": (256, (3, 32, 32)),
    "lstm_large": (256, (256, 64)),
}
LSTM_HIDDEN = {"lstm": 256, "gru": 256, "lstm_large": 512}


def _residual_block(b: GraphBuilder, name: str, source: str, channels: int) -> str:
    """conv relu -> conv -> + source -> relu; returns the block's output vertex."""
    same = {"kernel_size": (3, 3), "convolution_mode": "same"}
    b.add_layer(f"{name}a", ConvolutionLayer(channels, activation="relu", **same), source)
    b.add_layer(f"{name}b", ConvolutionLayer(channels, activation="identity", **same), f"{name}a")
    b.add_vertex(f"{name}sum", ElementWiseVertex("add"), f"{name}b", source)
    b.add_layer(f"{name}relu", ActivationLayer("relu"), f"{name}sum")
    return f"{name}relu"


def _precision_option(precision: str) -> dict[str, str]:
    """The configuration's ``precision``, left out at its float32 default: the float32 runs then time a
    build of sparkgrad from before the option too (run_checks.sh's BEFORE_SITE)."""
    return {} if precision == "float32" else {"precision": precision}


def _residual_graph(device: Device, precision: str) -> ComputationGraph:
    same = {"kernel_size": (3, 3), "convolution_mode": "same"}
    b = ComputationGraphConfiguration.builder(
        updater=updaters.Adam(1e-3), weight_init="relu", seed=0, **_precision_option(precision)
    )
    b.add_inputs("image").set_input_types(InputType.convolutional(28, 28, 1))
    b.add_layer("stem", ConvolutionLayer(16, activation="relu", **same), "image")
    block = _residual_block(b, "block1", "stem", 16)
    b.add_layer("pool1", SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)), block)
    b.add_layer("widen", ConvolutionLayer(32, activation="relu", **same), "pool1")
    block = _residual_block(b, "block2", "widen", 32)
    b.add_layer("pool2", SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)), block)
    b.add_layer("out", OutputLayer(10), "pool2")
    return ComputationGraph(b.set_outputs("out").build(), device=device).init()


def _transformer_graph(size: int, steps: int, device: Device, precision: str) -> ComputationGraph:
    b = ComputationGraphConfiguration.builder(
        updater=updaters.Adam(1e-3), seed=0, **_precision_option(precision)
    )
    b.add_inputs("seq").set_input_types(InputType.recurrent(size, steps))
    b.add_layer("pos", PositionEmbeddingLayer(steps), "seq")
    b.add_layer("attention", SelfAttentionLayer(size, n_heads=4), "pos")
    b.add_vertex("residual", ElementWiseVertex("add"), "pos", "attention")
    b.add_layer("norm", LayerNormalization(), "residual")
    b.add_layer("ff", DenseLayer(2 * size, activation="relu"), "norm")
    b.add_layer("ff_out", DenseLayer(size, activation="identity"), "ff")
    b.add_vertex("residual_ff", ElementWiseVertex("add"), "norm", "ff_out")
    b.add_layer("norm_ff", LayerNormalization(), "residual_ff")
    b.add_layer("pool", GlobalPoolingLayer("avg"), "norm_ff")
    b.add_layer("out", OutputLayer(10), "pool")
    return ComputationGraph(b.set_outputs("out").build(), device=device).init()


def _sparkgrad_step(
    name: str, x: np.ndarray, y: np.ndarray, device: Device, precision: str
) -> Callable[[], None]:
    if name in ("resnet", "transformer"):
        if name == "resnet":
            graph = _residual_graph(device, precision)
        else:
            graph = _transformer_graph(x.shape[1], x.shape[2], device, precision)
        ds = DataSet(x, y)
        return lambda: graph.fit(ds)
    same = {"kernel_size": (3, 3), "convolution_mode": "same", "activation": "relu"}
    if name in ("mlp", "mlp_large"):
        widths = (1024, 512) if name == "mlp" else (4096, 4096)
        layers = [DenseLayer(n, activation="relu") for n in widths] + [OutputLayer(10)]
        input_type = InputType.feed_forward(x.shape[1])
    elif name in LSTM_HIDDEN:
        cell = GRU if name == "gru" else LSTM
        layers = [LastTimeStep(cell(LSTM_HIDDEN[name])), OutputLayer(10)]
        input_type = InputType.recurrent(x.shape[1])
    elif name == "conv1d":
        layers = [
            Convolution1DLayer(64, kernel_size=5, activation="relu"),
            Subsampling1DLayer("max", kernel_size=2, stride=2),
            Convolution1DLayer(64, kernel_size=3, activation="relu"),
            GlobalPoolingLayer("max"),
            OutputLayer(10),
        ]
        input_type = InputType.recurrent(x.shape[1])
    elif name == "deconv":
        up = {"kernel_size": (4, 4), "stride": (2, 2), "padding": (1, 1), "activation": "relu"}
        layers = [Deconvolution2D(32, **up), Deconvolution2D(16, **up), OutputLayer(10)]
        input_type = InputType.convolutional(7, 7, 32)
    elif name == "vgg":
        layers = [
            ConvolutionLayer(64, **same),
            ConvolutionLayer(64, **same),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            ConvolutionLayer(128, **same),
            ConvolutionLayer(128, **same),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            DenseLayer(256, activation="relu"),
            OutputLayer(10),
        ]
        input_type = InputType.convolutional(32, 32, 3)
    else:
        layers = [
            ConvolutionLayer(20, kernel_size=(5, 5), activation="identity"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            ConvolutionLayer(50, kernel_size=(5, 5), activation="identity"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            DenseLayer(500, activation="relu"),
            OutputLayer(10),
        ]
        input_type = InputType.convolutional(28, 28, 1)
    conf = MultiLayerConfiguration(
        layers, input_type=input_type, updater=updaters.Adam(1e-3), seed=0, **_precision_option(precision)
    )
    net = MultiLayerNetwork(conf, device=device).init()
    ds = DataSet(x, y)
    return lambda: net.fit(ds)


def _torch_step(name: str, x: np.ndarray, y: np.ndarray, device: str, precision: str) -> Callable[[], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.argmax(axis=1))
    if name in LSTM_HIDDEN:
        model = _torch_last_step_rnn(x.shape[1], LSTM_HIDDEN[name], nn.GRU if name == "gru" else nn.LSTM)
        xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)))  # (batch, time, size)
    elif name == "conv1d":  # (batch, channels, time): PyTorch's Conv1d layout, DL4J's too
        model = nn.Sequential(
            nn.Conv1d(x.shape[1], 64, 5),
            nn.ReLU(),
            nn.MaxPool1d(2, 2),
            nn.Conv1d(64, 64, 3),
            nn.ReLU(),
            nn.AdaptiveMaxPool1d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        )
    elif name == "deconv":
        model = nn.Sequential(
            nn.ConvTranspose2d(32, 32, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(32, 16, 4, 2, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 28 * 28, 10),
        )
    elif name == "resnet":
        model = _torch_residual_cnn()
    elif name == "transformer":
        model = _torch_transformer(x.shape[1], x.shape[2])
        xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)))  # (batch, time, size)
    elif name in ("mlp", "mlp_large"):
        a, b = (1024, 512) if name == "mlp" else (4096, 4096)
        model = nn.Sequential(
            nn.Linear(x.shape[1], a), nn.ReLU(), nn.Linear(a, b), nn.ReLU(), nn.Linear(b, 10)
        )
    elif name == "vgg":
        model = _torch_vgg()
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 20, 5),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(20, 50, 5),
            nn.MaxPool2d(2, 2),
            nn.Flatten(),
            nn.Linear(50 * 4 * 4, 500),
            nn.ReLU(),
            nn.Linear(500, 10),
        )
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    if precision == "float32":

        def step() -> None:  # the host minibatch goes to the device every step, as in sparkgrad's fit
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xt.to(device)), yt.to(device)).backward()
            opt.step()

        return step
    # PyTorch's recipe for automatic mixed precision: forward and loss under autocast, float32 parameters
    # and optimizer state; fp16 scales the loss and skips steps with a non-finite gradient
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def mixed_step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=dtype):
            loss = loss_fn(model(xt.to(device)), yt.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return mixed_step


def _torch_last_step_rnn(size: int, hidden: int, cell: type):
    from torch import nn

    class LastStepRnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = cell(size, hidden, batch_first=True)
            self.head = nn.Linear(hidden, 10)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    return LastStepRnn()


def _torch_transformer(size: int, steps: int):
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Parameter(0.1 * torch.randn(steps, size))
            self.attention = nn.MultiheadAttention(size, 4, bias=False, batch_first=True)
            self.norm, self.norm_ff = nn.LayerNorm(size), nn.LayerNorm(size)
            self.ff = nn.Sequential(nn.Linear(size, 2 * size), nn.ReLU(), nn.Linear(2 * size, size))
            self.head = nn.Linear(size, 10)

        def forward(self, x):
            h = x + self.pos
            h = self.norm(h + self.attention(h, h, h, need_weights=False)[0])
            h = self.norm_ff(h + self.ff(h))
            return self.head(h.mean(dim=1))

    return Encoder()


def _torch_vgg():
    from torch import nn

    def conv(c_in: int, c_out: int) -> list:
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]

    return nn.Sequential(
        *conv(3, 64),
        *conv(64, 64),
        nn.MaxPool2d(2, 2),
        *conv(64, 128),
        *conv(128, 128),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(128 * 8 * 8, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def _torch_residual_block(channels: int):
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(channels, channels, 3, padding=1)
            self.b = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x):
            return nn.functional.relu(self.b(nn.functional.relu(self.a(x))) + x)

    return Block()


def _torch_residual_cnn():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        _torch_residual_block(16),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        _torch_residual_block(32),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def _time(step: Callable[[], None], steps: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(wall, process CPU) milliseconds per step; ``sync`` waits for the device's queued work."""
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - wall) / steps * 1e3, (time.process_time() - cpu) / steps * 1e3


def _gpu(torch: object) -> Device:
    """sparkgrad's GPU 0, after checking that PyTorch has one too; SystemExit saying what is missing."""
    try:
        device = resolve_device("cuda:0")
    except RuntimeError as e:
        raise SystemExit(f"--device cuda: {e}") from None
    if not torch.cuda.is_available():  # type: ignore[attr-defined]
        version = torch.__version__  # type: ignore[attr-defined]
        raise SystemExit(f"--device cuda: PyTorch {version} sees no GPU (a CPU-only build?)")
    return device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=sparkgrad.get_num_threads())
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating timed rounds; median and minimum are reported"
    )
    parser.add_argument(
        "--models", default="mlp,lenet,resnet,lstm", help=f"comma-separated, of {','.join(MODELS)}"
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where both frameworks train"
    )
    parser.add_argument(
        "--torch-tf32", action="store_true", help="let PyTorch's GPU convolutions and GEMMs use TF32"
    )
    parser.add_argument(
        "--precision",
        choices=["float32", "bf16", "fp16"],
        default="float32",
        help="mixed precision (GPU only): sparkgrad's configuration precision vs PyTorch's autocast",
    )
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.precision != "float32" and args.device != "cuda":
        parser.error(f"--precision {args.precision} needs --device cuda (the CPU kernels compute in float32)")

    import torch

    sparkgrad.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.torch_tf32
    device = resolve_device("cpu")
    syncs: dict[str, Callable[[], None]] = {"sparkgrad": lambda: None, "torch": lambda: None}
    where = f"threads={args.threads}"
    if args.device == "cuda":
        device = _gpu(torch)
        syncs = {"sparkgrad": device.xp.cuda.Device(0).synchronize, "torch": torch.cuda.synchronize}
        where = f"gpu={torch.cuda.get_device_name(0)} torch_tf32={args.torch_tf32} precision={args.precision}"
    print(f"device={device.name} {where} torch={torch.__version__} sparkgrad={sparkgrad.__version__}")
    rng = np.random.default_rng(0)
    for name in models:
        batch, shape = MODELS[name]
        x = rng.random((batch, *shape), dtype=np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]
        steps = {
            "sparkgrad": _sparkgrad_step(name, x, y, device, args.precision),
            "torch": _torch_step(name, x, y, args.device, args.precision),
        }
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in steps}
        for key, step in steps.items():  # warm-up: buffer allocation, BLAS/oneDNN/cuBLAS initialisation
            _time(step, 3, syncs[key])
        for _ in range(args.rounds):
            for key, step in steps.items():
                times[key].append(_time(step, args.steps, syncs[key]))
        stats = [("median", 0), ("min", 0)] + ([("cpu min", 1)] if args.device == "cpu" else [])
        for label, pick in stats:
            stat = statistics.median if label == "median" else min
            sg, pt = (stat(t[pick] for t in times[k]) for k in ("sparkgrad", "torch"))
            line = (
                f"{name:10s} batch={batch:4d} {label:7s} sparkgrad {sg:8.2f} ms/step  torch {pt:8.2f} ms/step"
            )
            print(f"{line}  ratio {sg / pt:5.2f}x")


if __name__ == "__main__":
    main()

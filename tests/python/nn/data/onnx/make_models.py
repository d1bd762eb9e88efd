"""Writes the PyTorch-exported ONNX models that tests/python/nn/test_onnx_import.py imports, with an input
batch and PyTorch's output for it (<name>.onnx, <name>.npz). Run by hand where torch is installed (the
bench extra): ``python tests/python/nn/data/onnx/make_models.py``; the tests need only the files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).parent


class Residual(nn.Module):
    """Two branches over the same features, added and concatenated: a graph, not a chain."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        r = torch.relu(s + self.branch(s))
        return self.head(torch.flatten(self.pool(torch.cat([r, s], 1)), 1))


class WideAndDeep(nn.Module):
    """Click-through style: two categorical columns looked up in embedding tables beside numeric ones."""

    def __init__(self) -> None:
        super().__init__()
        self.users, self.items = nn.Embedding(1000, 8), nn.Embedding(50, 4)
        self.deep = nn.Sequential(nn.Linear(8 + 4 + 5, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, user: torch.Tensor, item: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.deep(torch.cat([self.users(user), self.items(item).squeeze(1), x], 1))


class Text(nn.Module):
    """Token indices embedded and read by an LSTM (batch first): its last step, or for the bidirectional
    one its mean over time, into a Linear."""

    def __init__(self, bidirectional: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.rnn = nn.LSTM(8, 16, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(32 if bidirectional else 16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out.mean(1) if self.rnn.bidirectional else out[:, -1, :])


def models() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    return {
        "mlp": (
            nn.Sequential(
                nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 16),
                nn.Tanh(), nn.Linear(16, 4), nn.Softmax(dim=1),
            ),
            (12,),
        ),
        "cnn": (
            nn.Sequential(
                nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 12, 3, stride=2),
                nn.ELU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(12 * 3 * 3, 10),
            ),
            (1, 28, 28),
        ),
        "upsampling": (
            nn.Sequential(
                nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1), nn.LeakyReLU(), nn.Upsample(scale_factor=2),
                nn.ZeroPad2d((1, 2, 0, 1)), nn.Conv2d(6, 3, 3), nn.Sigmoid(), nn.AdaptiveMaxPool2d(1),
                nn.Flatten(), nn.Linear(3, 2),
            ),
            (4, 5, 5),
        ),
        "conv1d": (
            nn.Sequential(
                nn.Conv1d(3, 8, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(8, 8, 3), nn.Tanh(),
                nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 3),
            ),
            (3, 20),
        ),
        "residual": (Residual(), (3, 10, 10)),
    }  # fmt: skip


def export(name: str, model: nn.Module, feeds: dict[str, torch.Tensor]) -> None:
    """<name>.onnx with a dynamic batch axis, and <name>.npz holding ``feeds`` and the model's output y."""
    names = list(feeds)
    torch.onnx.export(
        model, tuple(feeds.values()), HERE / f"{name}.onnx", input_names=names, output_names=["y"],
        dynamic_axes={n: {0: "batch"} for n in [*names, "y"]}, opset_version=17, dynamo=False,
    )  # fmt: skip
    with torch.no_grad():
        y = model(*feeds.values())
    np.savez(HERE / f"{name}.npz", y=y.numpy(), **{n: f.numpy() for n, f in feeds.items()})
    print(name, (HERE / f"{name}.onnx").stat().st_size, "bytes")


def main() -> None:
    torch.manual_seed(0)
    for name, (model, shape) in models().items():
        model.eval()
        with torch.no_grad():  # running statistics away from their start, so that they matter
            for module in model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.running_mean.normal_()
                    module.running_var.uniform_(0.5, 2.0)
        export(name, model, {"x": torch.randn(6, *shape)})
    for name, text in (("text_lstm", Text(False)), ("text_bilstm", Text(True))):
        export(name, text.eval(), {"tokens": torch.randint(0, 100, (6, 12))})
    # several inputs: user ids (batch,), item ids (batch, 1) and numeric features
    feeds = {
        "user": torch.randint(0, 1000, (6,)),
        "item": torch.randint(0, 50, (6, 1)),
        "x": torch.randn(6, 5),
    }
    export("wide_and_deep", WideAndDeep().eval(), feeds)


if __name__ == "__main__":
    main()

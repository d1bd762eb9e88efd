"""InputType: the shape of the data entering a network, used to infer ``n_in`` and layer shapes."""

from __future__ import annotations

import dataclasses

from sparkgrad._config import Config, check_int

_KINDS = ("feed_forward", "convolutional", "convolutional_flat", "recurrent")


@dataclasses.dataclass
class InputType(Config):
    """Shape of one example. Build with the factory methods, not the constructor.

    Feed-forward examples are vectors of ``size``; convolutional ones are ``(channels, height, width)``
    (NCHW batches); convolutional_flat ones are vectors of ``height * width * channels`` reshaped to NCHW
    by the network; recurrent ones are ``(size, time_steps)`` (batches ``(N, size, T)``). A sequence of
    images is recurrent with ``height``, ``width`` and ``channels`` set: each step is an image flattened
    in (channels, height, width) order, ``size = channels * height * width``.
    """

    kind: str
    size: int = 0
    height: int = 0
    width: int = 0
    channels: int = 0
    time_steps: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind: expected one of {', '.join(_KINDS)}, got {self.kind!r}")
        images = self.kind == "recurrent" and (self.height or self.width or self.channels)
        if self.kind == "feed_forward" or (self.kind == "recurrent" and not images):
            self.size = check_int("size", self.size, minimum=1)
        else:
            self.height = check_int("height", self.height, minimum=1)
            self.width = check_int("width", self.width, minimum=1)
            self.channels = check_int("channels", self.channels, minimum=1)
            self.size = self.height * self.width * self.channels
        if self.time_steps is not None:
            self.time_steps = check_int("time_steps", self.time_steps, minimum=1)

    @staticmethod
    def feed_forward(n: int) -> InputType:
        """Vectors of length ``n``: features ``(batch, n)``."""
        return InputType("feed_forward", size=n)

    @staticmethod
    def convolutional(height: int, width: int, channels: int) -> InputType:
        """Images: features ``(batch, channels, height, width)``."""
        return InputType("convolutional", height=height, width=width, channels=channels)

    @staticmethod
    def convolutional_flat(height: int, width: int, channels: int) -> InputType:
        """Flattened images ``(batch, channels * height * width)`` (C order of channels, height, width)."""
        return InputType("convolutional_flat", height=height, width=width, channels=channels)

    @staticmethod
    def recurrent(size: int, time_steps: int | None = None) -> InputType:
        """Sequences: features ``(batch, size, time)``, masks ``(batch, time)``; feed-forward layers apply at
        every time step. ``time_steps`` None accepts any length (pad variable-length data and mask it)."""
        return InputType("recurrent", size=size, time_steps=time_steps)

    @staticmethod
    def recurrent_images(height: int, width: int, channels: int, time_steps: int | None = None) -> InputType:
        """Sequences of images: features ``(batch, channels * height * width, time)``, every step an image
        flattened in (channels, height, width) order (DL4J's RnnToCnnPreProcessor layout); convolutional
        layers run at every step and recurrent layers see each step's flattened activations (DL4J's
        automatic CnnToRnnPreProcessor)."""
        return InputType("recurrent", height=height, width=width, channels=channels, time_steps=time_steps)

    def step_type(self) -> InputType:
        """The type of one time step of recurrent input: its image, or a feed-forward vector."""
        if self.kind != "recurrent":
            raise ValueError(f"step_type: {self.describe()} is not recurrent")
        if self.channels:
            return InputType.convolutional(self.height, self.width, self.channels)
        return InputType.feed_forward(self.size)

    @property
    def is_convolutional(self) -> bool:
        return self.kind in ("convolutional", "convolutional_flat")

    def shape(self) -> tuple[int, ...]:
        """Per-example shape as the layers see it; recurrent: the per-step ``(size,)`` (each layer sees
        (batch, time, size) sequences or, for per-step layers, (batch * time, size) rows)."""
        if self.is_convolutional:
            return (self.channels, self.height, self.width)
        return (self.size,)

    def describe(self) -> str:
        """Short human-readable form used in summaries and error messages."""
        if self.is_convolutional or self.channels:
            return f"{self.kind}({self.channels}x{self.height}x{self.width})"
        return f"{self.kind}({self.size})"


__all__ = ["InputType"]

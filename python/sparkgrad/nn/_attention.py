"""Runtimes of the attention layers (SelfAttentionLayer, LearnedSelfAttentionLayer) and of
PositionEmbeddingLayer: sequence runtimes (the interface of :mod:`sparkgrad.nn._recurrent`) over whole
sequences (N, T, C) and their features mask.

The projections are GEMMs over every step at once (``gemm``, the heads interleaved in the feature axis as
the projection leaves them); the attention itself, scores, masked softmax and weighted sum per example
and head, is the native ``attention_forward`` / ``attention_backward`` pair (cpp/src/nn/attention.cpp).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sparkgrad.nn import layers as L
from sparkgrad.nn._recurrent import SequenceRuntime


def _whole_sequences(conf: Any, stateful: bool) -> None:
    if stateful:
        raise ValueError(
            f"features: {type(conf).__name__} needs the whole sequence: no rnn_time_step or truncated BPTT"
        )


class _AttentionRuntime(SequenceRuntime):
    """The projections and the attention shared by both attention layers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        c = self.conf
        self.heads = c.n_heads
        self.size = c.projected_size
        self.scale = 1.0 / math.sqrt(self.size)
        self.n_in = c.n_in

    def _w2(self, name: str, grads: bool = False) -> np.ndarray:
        """Projection ``name`` (heads, size, n_in) viewed as (heads * size, n_in)."""
        return (self.grads if grads else self.params)[name].reshape(self.heads * self.size, self.n_in)

    def _project(self, rows: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """``rows`` (R, n_in) @ W^T into a buffer of ``shape`` (R * heads * size values)."""
        out = self.buf(name, shape)
        self.k.gemm(rows, self._w2(name), trans_b=True, out=out.reshape(-1, self.heads * self.size))
        return out

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any) -> np.ndarray:
        n, tq, _ = q.shape
        self.q, self.k_in, self.v = q, k, v
        self.weights = self.buf("weights", (n, self.heads, tq, k.shape[1]))
        att = self.buf("att", (n, tq, v.shape[2]))
        self.k.attention_forward(q, k, v, self.weights, att, self.heads, self.scale, mask=mask)
        self.att = att
        return att

    def _attend_backward(self, datt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dq, dk, dv = (self.buf(f"d{s}", a.shape) for s, a in (("q", self.q), ("k", self.k_in), ("v", self.v)))
        self.k.attention_backward(
            self.q, self.k_in, self.v, self.weights, datt, self.buf("dweights", self.weights.shape),
            dq, dk, dv, self.heads, self.scale,
        )  # fmt: skip
        return dq, dk, dv

    def _output_projection(self, att: np.ndarray) -> np.ndarray:
        n, t, _ = att.shape
        y = self.buf("y", (n, t, self.conf.n_out))
        self.k.gemm(att.reshape(n * t, -1), self.params[L.ATTENTION_OUT], out=y.reshape(n * t, -1))
        return y

    def _output_projection_backward(self, dy: np.ndarray) -> np.ndarray:
        """Writes dWo; returns dL/d(attention output)."""
        n, t, _ = dy.shape
        dy2 = dy.reshape(n * t, -1)
        self.k.gemm(self.att.reshape(n * t, -1), dy2, trans_a=True, out=self.grads[L.ATTENTION_OUT])
        datt = self.buf("datt", self.att.shape)
        self.k.gemm(dy2, self.params[L.ATTENTION_OUT], trans_b=True, out=datt.reshape(n * t, -1))
        return datt

    def _key_value_backward(self, dk: np.ndarray, dv: np.ndarray, need_dx: bool) -> np.ndarray | None:
        """Writes dWk, dWv from the keys' and values' gradients; returns their part of dL/dx."""
        n, t, c = self.x.shape
        x2 = self.x.reshape(n * t, c)
        rows = (dk.reshape(n * t, -1), dv.reshape(n * t, -1))
        for d, name in zip(rows, (L.ATTENTION_KEY, L.ATTENTION_VALUE)):
            self.k.gemm(d, x2, trans_a=True, out=self._w2(name, grads=True))
        if not need_dx:
            return None
        dx = self.buf("dx", self.x.shape)
        dx2 = dx.reshape(n * t, c)
        self.k.gemm(rows[0], self._w2(L.ATTENTION_KEY), out=dx2)
        self.k.gemm(rows[1], self._w2(L.ATTENTION_VALUE), beta=1.0, out=dx2)
        return dx


class SelfAttentionRuntime(_AttentionRuntime):
    """SelfAttentionLayer: queries, keys and values from the same steps; masked query steps output zero."""

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        _whole_sequences(self.conf, stateful)
        n, t, c = x.shape
        self.x, self.mask = x, mask
        if not self.conf.project_input:
            y = self._attend(x, x, x, mask)
        else:
            x2 = x.reshape(n * t, c)
            shape = (n, t, self.heads * self.size)
            q, k, v = (
                self._project(x2, name, shape)
                for name in (L.ATTENTION_QUERY, L.ATTENTION_KEY, L.ATTENTION_VALUE)
            )
            y = self._output_projection(self._attend(q, k, v, mask))
        if mask is not None:
            y = y * mask[:, :, None]
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if self.mask is not None:
            dy = dy * self.mask[:, :, None]
        if not self.conf.project_input:
            dq, dk, dv = self._attend_backward(self.xp.ascontiguousarray(dy))
            return dq + dk + dv if need_dx else None
        dq, dk, dv = self._attend_backward(self._output_projection_backward(dy))
        n, t, c = self.x.shape
        dq2 = dq.reshape(n * t, -1)
        self.k.gemm(dq2, self.x.reshape(n * t, c), trans_a=True, out=self._w2(L.ATTENTION_QUERY, grads=True))
        dx = self._key_value_backward(dk, dv, need_dx)
        if dx is not None:
            self.k.gemm(dq2, self._w2(L.ATTENTION_QUERY), beta=1.0, out=dx.reshape(n * t, c))
        return dx


class LearnedSelfAttentionRuntime(_AttentionRuntime):
    """LearnedSelfAttentionLayer: the learned queries Q (n_in, n_queries), the same for every example,
    attend to the steps; the output (N, n_queries, n_out) has no mask."""

    def output_mask(self, mask: Any) -> Any:
        return None

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        _whole_sequences(self.conf, stateful)
        n, t, c = x.shape
        nq = self.conf.n_queries
        self.x, self.mask = x, mask
        queries = self.params[L.LEARNED_QUERIES]  # (n_in, n_queries)
        if not self.conf.project_input:
            q = self.buf("q_tiled", (n, nq, c))
            q[...] = queries.T[None]
            return self._attend(q, x, x, mask)
        hd = self.heads * self.size
        q_once = self.buf("q_once", (nq, hd))
        self.k.gemm(queries, self._w2(L.ATTENTION_QUERY), trans_a=True, trans_b=True, out=q_once)
        q = self.buf("q_tiled", (n, nq, hd))
        q[...] = q_once[None]
        x2 = x.reshape(n * t, c)
        k, v = (self._project(x2, name, (n, t, hd)) for name in (L.ATTENTION_KEY, L.ATTENTION_VALUE))
        return self._output_projection(self._attend(q, k, v, mask))

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        queries, g_queries = self.params[L.LEARNED_QUERIES], self.grads[L.LEARNED_QUERIES]
        if not self.conf.project_input:
            dq, dk, dv = self._attend_backward(self.xp.ascontiguousarray(dy))
            g_queries[...] = dq.sum(axis=0).T
            return dk + dv if need_dx else None
        dq, dk, dv = self._attend_backward(self._output_projection_backward(dy))
        dq_once = self.xp.ascontiguousarray(dq.sum(axis=0))  # (n_queries, heads * size)
        self.k.gemm(dq_once, queries, trans_a=True, trans_b=True, out=self._w2(L.ATTENTION_QUERY, grads=True))
        self.k.gemm(self._w2(L.ATTENTION_QUERY), dq_once, trans_a=True, trans_b=True, out=g_queries)
        return self._key_value_backward(dk, dv, need_dx)


class PositionEmbeddingRuntime(SequenceRuntime):
    """PositionEmbeddingLayer: ``x + W[:, :T]^T`` at every present step (masked steps output zero)."""

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        _whole_sequences(self.conf, stateful)
        t = x.shape[1]
        if t > self.conf.sequence_length:
            raise ValueError(
                f"features: {t} time steps, but PositionEmbeddingLayer.sequence_length is "
                f"{self.conf.sequence_length}"
            )
        self.mask = mask
        y = self.buf("y", x.shape)
        self.xp.add(x, self.params[L.WEIGHT][:, :t].T[None], out=y)
        if mask is not None:
            y *= mask[:, :, None]
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if self.mask is not None:
            dy = dy * self.mask[:, :, None]
        g = self.grads[L.WEIGHT]
        t = dy.shape[1]
        g[:, t:] = 0
        g[:, :t] = dy.sum(axis=0).T
        return dy if need_dx else None


ATTENTION_RUNTIMES = {
    L.SelfAttentionLayer: SelfAttentionRuntime,
    L.LearnedSelfAttentionLayer: LearnedSelfAttentionRuntime,
    L.PositionEmbeddingLayer: PositionEmbeddingRuntime,
}

__all__ = ["ATTENTION_RUNTIMES"]

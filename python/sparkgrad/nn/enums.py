"""Enumerations of the nn package; every argument taking one also accepts its value as a string."""

from __future__ import annotations

import enum


class Activation(enum.Enum):
    """Element-wise activation functions (softmax is over the feature axis)."""

    IDENTITY = "identity"
    RELU = "relu"
    LEAKYRELU = "leakyrelu"
    ELU = "elu"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    SOFTMAX = "softmax"
    SOFTPLUS = "softplus"
    HARDTANH = "hardtanh"


class LossFunction(enum.Enum):
    """Loss functions with DL4J definitions; the per-example score is the sum over output columns."""

    MCXENT = "mcxent"
    NEGATIVELOGLIKELIHOOD = "negativeloglikelihood"
    MSE = "mse"
    L1 = "l1"
    L2 = "l2"
    XENT = "xent"
    HINGE = "hinge"
    SQUARED_HINGE = "squared_hinge"
    KL_DIVERGENCE = "kl_divergence"


class WeightInit(enum.Enum):
    """Weight initialisation schemes (DL4J definitions; biases always start at zero)."""

    XAVIER = "xavier"
    XAVIER_UNIFORM = "xavier_uniform"
    RELU = "relu"
    RELU_UNIFORM = "relu_uniform"
    LECUN_NORMAL = "lecun_normal"
    NORMAL = "normal"
    UNIFORM = "uniform"
    ZERO = "zero"
    ONES = "ones"


class PoolingType(enum.Enum):
    """Pooling kinds: SubsamplingLayer takes max/avg, GlobalPoolingLayer also sum."""

    MAX = "max"
    AVG = "avg"
    SUM = "sum"


class ConvolutionMode(enum.Enum):
    """TRUNCATE: explicit padding, output floor-divided; SAME: output ceil(in / stride), padding derived;
    STRICT: as TRUNCATE, but a window that does not tile the padded input exactly
    (``(in + 2 padding - kernel) % stride != 0``) is a configuration error instead of a dropped remainder
    (DL4J's ConvolutionMode.Strict). Deconvolution2D computes the same size for TRUNCATE and STRICT."""

    TRUNCATE = "truncate"
    SAME = "same"
    STRICT = "strict"


class GradientNormalization(enum.Enum):
    """DL4J's GradientNormalization, applied to a layer's raw gradient before l1/l2, the updater and
    weight decay. Per layer: all of the layer's trained parameters as one vector; per param type: each
    parameter array (W, b, an LSTM's RW ...) on its own. ``t`` is ``gradient_normalization_threshold``.

    NONE: unchanged. RENORMALIZE_L2_PER_LAYER / _PER_PARAM_TYPE: ``g / ||g||_2`` (a zero gradient stays
    zero). CLIP_ELEMENT_WISE_ABSOLUTE_VALUE: every element clipped to [-t, t].
    CLIP_L2_PER_LAYER / _PER_PARAM_TYPE: ``g * t / ||g||_2`` where ``||g||_2 > t``, else unchanged.
    """

    NONE = "none"
    RENORMALIZE_L2_PER_LAYER = "renormalize_l2_per_layer"
    RENORMALIZE_L2_PER_PARAM_TYPE = "renormalize_l2_per_param_type"
    CLIP_ELEMENT_WISE_ABSOLUTE_VALUE = "clip_element_wise_absolute_value"
    CLIP_L2_PER_LAYER = "clip_l2_per_layer"
    CLIP_L2_PER_PARAM_TYPE = "clip_l2_per_param_type"


__all__ = [
    "Activation",
    "ConvolutionMode",
    "GradientNormalization",
    "LossFunction",
    "PoolingType",
    "WeightInit",
]

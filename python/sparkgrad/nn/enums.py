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
    """TRUNCATE: explicit padding, output floor-divided; SAME: output ceil(in / stride), padding derived."""

    TRUNCATE = "truncate"
    SAME = "same"


__all__ = ["Activation", "ConvolutionMode", "LossFunction", "PoolingType", "WeightInit"]

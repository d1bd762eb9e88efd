"""Neural networks: configurations, layers and MultiLayerNetwork over one flat parameter buffer."""

from __future__ import annotations

from sparkgrad.nn import updaters
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.enums import Activation, ConvolutionMode, LossFunction, PoolingType, WeightInit
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.layers import (
    ActivationLayer,
    BatchNormalization,
    ConvolutionLayer,
    DenseLayer,
    DropoutLayer,
    GlobalPoolingLayer,
    Layer,
    LossLayer,
    OutputLayer,
    SubsamplingLayer,
)
from sparkgrad.nn.listeners import ScoreIterationListener, TrainingListener
from sparkgrad.nn.network import MultiLayerNetwork

__all__ = [
    "Activation",
    "ActivationLayer",
    "BatchNormalization",
    "ConvolutionLayer",
    "ConvolutionMode",
    "DenseLayer",
    "DropoutLayer",
    "GlobalPoolingLayer",
    "InputType",
    "Layer",
    "LossFunction",
    "LossLayer",
    "MultiLayerConfiguration",
    "MultiLayerNetwork",
    "OutputLayer",
    "PoolingType",
    "ScoreIterationListener",
    "SubsamplingLayer",
    "TrainingListener",
    "WeightInit",
    "updaters",
]

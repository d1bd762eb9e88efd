"""Neural networks: configurations, layers and MultiLayerNetwork over one flat parameter buffer."""

from __future__ import annotations

from sparkgrad.nn import updaters
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.enums import Activation, ConvolutionMode, LossFunction, PoolingType, WeightInit
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.layers import (
    LSTM,
    ActivationLayer,
    BatchNormalization,
    Bidirectional,
    BidirectionalMode,
    ConvolutionLayer,
    DenseLayer,
    DropoutLayer,
    GlobalPoolingLayer,
    LastTimeStep,
    Layer,
    LossLayer,
    OutputLayer,
    RnnLossLayer,
    RnnOutputLayer,
    SimpleRnn,
    SubsamplingLayer,
)
from sparkgrad.nn.listeners import ScoreIterationListener, TrainingListener
from sparkgrad.nn.network import MultiLayerNetwork

__all__ = [
    "Activation",
    "ActivationLayer",
    "BatchNormalization",
    "Bidirectional",
    "BidirectionalMode",
    "ConvolutionLayer",
    "ConvolutionMode",
    "DenseLayer",
    "DropoutLayer",
    "GlobalPoolingLayer",
    "InputType",
    "LSTM",
    "LastTimeStep",
    "Layer",
    "LossFunction",
    "LossLayer",
    "MultiLayerConfiguration",
    "MultiLayerNetwork",
    "OutputLayer",
    "PoolingType",
    "RnnLossLayer",
    "RnnOutputLayer",
    "ScoreIterationListener",
    "SimpleRnn",
    "SubsamplingLayer",
    "TrainingListener",
    "WeightInit",
    "updaters",
]

"""Neural networks: configurations, layers, vertices, MultiLayerNetwork and ComputationGraph over one flat
parameter buffer."""

from __future__ import annotations

from sparkgrad.nn import updaters
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.enums import Activation, ConvolutionMode, LossFunction, PoolingType, WeightInit
from sparkgrad.nn.graph import ComputationGraph, ComputationGraphConfiguration, GraphBuilder, VertexSpec
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
from sparkgrad.nn.vertices import (
    CnnToFeedForwardPreProcessor,
    ElementWiseOp,
    ElementWiseVertex,
    FeedForwardToCnnPreProcessor,
    GraphVertex,
    InputPreProcessor,
    L2NormalizeVertex,
    L2Vertex,
    MergeVertex,
    PreprocessorVertex,
    ReshapeVertex,
    ScaleVertex,
    ShiftVertex,
    StackVertex,
    SubsetVertex,
    UnstackVertex,
)

__all__ = [
    "Activation",
    "ActivationLayer",
    "BatchNormalization",
    "CnnToFeedForwardPreProcessor",
    "ComputationGraph",
    "ComputationGraphConfiguration",
    "ConvolutionLayer",
    "ConvolutionMode",
    "DenseLayer",
    "DropoutLayer",
    "ElementWiseOp",
    "ElementWiseVertex",
    "FeedForwardToCnnPreProcessor",
    "GlobalPoolingLayer",
    "GraphBuilder",
    "GraphVertex",
    "InputPreProcessor",
    "InputType",
    "L2NormalizeVertex",
    "L2Vertex",
    "Layer",
    "LossFunction",
    "LossLayer",
    "MergeVertex",
    "MultiLayerConfiguration",
    "MultiLayerNetwork",
    "OutputLayer",
    "PoolingType",
    "PreprocessorVertex",
    "ReshapeVertex",
    "ScaleVertex",
    "ScoreIterationListener",
    "ShiftVertex",
    "StackVertex",
    "SubsamplingLayer",
    "SubsetVertex",
    "TrainingListener",
    "UnstackVertex",
    "VertexSpec",
    "WeightInit",
    "updaters",
]

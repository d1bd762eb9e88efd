"""Sequence features in DataFrames (issue 39 item 4): a network with recurrent input of values takes
an array per row of any length whose elements are the time steps (arrays of numbers or Vectors),
padded per batch with the lengths as the features mask, through the DataFrame conversion,
fit(DataFrame), the estimators, transform and predict."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.linalg import Matrices, Vectors
from pyspark.sql import types as T

from sparkgrad.data import DataSet
from sparkgrad.ml import SparkgradClassificationModel, SparkgradRegressor
from sparkgrad.nn import (
    GRU,
    LSTM,
    ComputationGraphConfiguration,
    GlobalPoolingLayer,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
)
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer
from sparkgrad.spark.columns import dataframe_datasets

SIZE = 2
# float32 outputs of the same network on the same values, batched differently: a few roundings of
# the recurrent products (hidden 6, at most 8 steps)
OUTPUT_TOL = 64 * float(np.finfo(np.float32).eps)


def _lstm_conf(seed: int = 2) -> MultiLayerConfiguration:
    layers = [LastTimeStep(LSTM(6)), OutputLayer(2)]
    return MultiLayerConfiguration(
        layers, input_type=InputType.recurrent(SIZE), updater=Adam(0.05), activation="tanh", seed=seed
    )


def _sequences(rng, n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Sequences of 2-8 steps of SIZE values; class 1 when the first values sum above 0."""
    seqs = [rng.normal(size=(rng.integers(2, 9), SIZE)) for _ in range(n)]
    return seqs, np.array([float(s[:, 0].sum() > 0) for s in seqs])


def _padded(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(batch, SIZE, time) zero-padded features and the (batch, time) mask, as the conversion makes."""
    steps = max(len(s) for s in seqs)
    x = np.zeros((len(seqs), SIZE, steps), dtype=np.float32)
    mask = np.zeros((len(seqs), steps), dtype=np.float32)
    for i, s in enumerate(seqs):
        x[i, :, : len(s)], mask[i, : len(s)] = s.T, 1
    return x, mask


def _frame(spark, seqs, labels, vectors: bool = False):
    step = T.ArrayType(T.DoubleType()) if not vectors else Vectors.dense([0.0]).__UDT__
    schema = T.StructType(
        [T.StructField("series", T.ArrayType(step)), T.StructField("label", T.DoubleType())]
    )
    rows = [
        ([Vectors.dense(v) for v in s] if vectors else s.tolist(), float(y)) for s, y in zip(seqs, labels)
    ]
    return spark.createDataFrame(rows, schema)


@pytest.mark.parametrize("vectors", [False, True], ids=["arrays", "vectors"])
def test_sequences_become_padded_features_and_length_masks(spark, vectors) -> None:
    rng = np.random.default_rng(1)
    seqs, labels = _sequences(rng, 9)
    df = _frame(spark, seqs, labels, vectors).coalesce(1)
    parts = dataframe_datasets(df, "series", "label", _lstm_conf(), 4).collect()
    assert [p.num_examples() for p in parts] == [4, 4, 1]
    merged = DataSet.merge(parts)
    x, mask = _padded(seqs)
    assert merged.features.dtype == np.float32
    np.testing.assert_array_equal(merged.features[..., : x.shape[2]], x)  # exact: a float32 cast
    np.testing.assert_array_equal(merged.features_mask[:, : x.shape[2]], mask)
    assert not merged.features_mask[:, x.shape[2] :].any()
    np.testing.assert_array_equal(merged.labels, np.eye(2, dtype=np.float32)[labels.astype(int)])


def test_fit_dataframe_of_sequences_learns_and_the_model_transforms_them(spark) -> None:
    rng = np.random.default_rng(2)
    seqs, labels = _sequences(rng, 256)
    df = _frame(spark, seqs, labels).repartition(2)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, rdd_data_set_num_examples=16, averaging_frequency=2, rng_seed=5
    )
    x, mask = _padded(seqs)
    ds = DataSet(x, np.eye(2, dtype=np.float32)[labels.astype(int)], features_mask=mask)
    with SparkMultiLayer(spark, _lstm_conf(), master) as spark_net:
        before = spark_net.network.score(ds)
        net = spark_net.fit(df, epochs=6, features_col="series")
    # measured over seeds 2-6 of the data and the network: the score falls to 0.09-0.18 of the first
    assert net.score(ds) < 0.5 * before

    model = SparkgradClassificationModel(net).setFeaturesCol("series")
    assert model.numFeatures == SIZE
    rows = model.transform(df.coalesce(1)).select("series", "probability").collect()
    got_seqs = [np.array(r[0]) for r in rows]
    x, mask = _padded(got_seqs)
    np.testing.assert_allclose(
        [r[1].toArray() for r in rows], net.output(x, features_mask=mask), rtol=0, atol=OUTPUT_TOL
    )
    # the mask changes the answer: each row's output is its own sequence's, alone and unpadded
    alone = np.concatenate([net.output(s.T[None].astype(np.float32)) for s in got_seqs])
    np.testing.assert_allclose([r[1].toArray() for r in rows], alone, rtol=0, atol=OUTPUT_TOL)
    unmasked = net.output(x)
    assert np.abs(unmasked - alone).max() > 100 * OUTPUT_TOL
    # one sequence for predict: a Matrix of time steps x values
    s = got_seqs[0]
    matrix = Matrices.dense(len(s), SIZE, s.ravel(order="F").tolist())
    np.testing.assert_allclose(model.predictProbability(matrix).toArray(), alone[0], rtol=0, atol=OUTPUT_TOL)


def test_a_regressor_over_a_graph_of_vector_steps(spark) -> None:
    """The estimator path with a ComputationGraph (GRU, average pooling over the unmasked steps)."""
    rng = np.random.default_rng(3)
    seqs = [rng.normal(size=(rng.integers(3, 7), SIZE)) for _ in range(200)]
    target = np.array([s[:, 1].mean() for s in seqs])
    conf = (
        ComputationGraphConfiguration.builder(seed=4, updater=Adam(0.02))
        .add_inputs("series")
        .set_input_types(InputType.recurrent(SIZE))
        .add_layer("gru", GRU(8, activation="tanh"), "series")
        .add_layer("pool", GlobalPoolingLayer("avg"), "gru")
        .add_layer("out", OutputLayer(1, activation="identity", loss="mse"), "pool")
        .set_outputs("out")
        .build()
    )
    df = _frame(spark, seqs, target, vectors=True)
    regressor = SparkgradRegressor(
        networkConf=conf,
        trainingMaster=ParameterAveragingTrainingMaster(averaging_frequency=4, rng_seed=3),
        epochs=15,
        batchSize=20,
    ).setFeaturesCol("series")
    model = regressor.fit(df)
    rows = model.transform(df).select("series", "prediction", "label").collect()
    predictions = np.array([r[1] for r in rows])
    truth = np.array([r[2] for r in rows])
    # the mean of 3-6 standard normals; measured over seeds 3-7 of the data and the network, the mean
    # squared error is 0.009-0.019 of the target's variance (a masked mean is what it has to learn)
    assert np.mean((predictions - truth) ** 2) < 0.1 * truth.var()
    x, mask = _padded([np.array([v.toArray() for v in r[0]]) for r in rows])
    expected = model.network.output(x, features_masks=[mask])[0][:, 0]
    np.testing.assert_allclose(predictions, expected, rtol=0, atol=OUTPUT_TOL)


def test_sequence_column_errors(spark) -> None:
    conf = _lstm_conf()
    df = spark.createDataFrame([([1.0, 2.0], 0.0)], ["series", "label"])
    with pytest.raises(
        TypeError, match="column 'series' has type array<double>, but the network takes sequences"
    ):
        dataframe_datasets(df, "series", "label", conf, 4)
    df = spark.createDataFrame([([[1.0, 2.0], [3.0]], 0.0)], ["series", "label"])
    with pytest.raises(Exception, match=r"'series' \(a time step\): 1 rows do not have 2 values"):
        dataframe_datasets(df, "series", "label", conf, 4).collect()
    df = spark.createDataFrame([([[1.0, 2.0]], 0.0), ([], 1.0)], "series array<array<double>>, label double")
    with pytest.raises(Exception, match="1 rows hold an empty sequence"):
        dataframe_datasets(df, "series", "label", conf, 4).collect()
    fixed = MultiLayerConfiguration(
        [LastTimeStep(LSTM(3)), OutputLayer(2)], input_type=InputType.recurrent(SIZE, 2)
    )
    df = spark.createDataFrame([([[1.0, 2.0]] * 3, 0.0)], ["series", "label"])
    with pytest.raises(Exception, match="a sequence has 3 time steps, the input type takes 2"):
        dataframe_datasets(df, "series", "label", fixed, 4).collect()
    per_step = MultiLayerConfiguration([LSTM(3), RnnOutputLayer(2)], input_type=InputType.recurrent(SIZE))
    with pytest.raises(
        ValueError, match="sequences in, recurrent\\(2\\) out: a label column holds one label"
    ):
        dataframe_datasets(df, "series", "label", per_step, 4)
    model = SparkgradClassificationModel(MultiLayerNetwork(conf).init())
    with pytest.raises(ValueError, match="a sequence's time steps have 3 values, the network takes 2"):
        model.predictProbability(Matrices.dense(2, 3, [0.0] * 6))

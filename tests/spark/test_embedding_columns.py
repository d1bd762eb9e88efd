"""Index columns into embedding layers (issue 39 item 4): an integer column per example for an
EmbeddingLayer, an array of integers of any length for an EmbeddingSequenceLayer (padded per batch, the
lengths as the features mask), through the DataFrame conversion, fit(DataFrame), the ml models'
transform and predict."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors
from pyspark.sql import types as T

from sparkgrad.data import DataSet
from sparkgrad.ml import SparkgradClassificationModel, SparkgradClassifier
from sparkgrad.nn import (
    LSTM,
    EmbeddingLayer,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
)
from sparkgrad.nn.updaters import Sgd
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer
from sparkgrad.spark.columns import dataframe_datasets

VOCAB = 20
OUTPUT_TOL = 64 * float(np.finfo(np.float32).eps)


def _word_conf() -> MultiLayerConfiguration:
    layers = [EmbeddingLayer(VOCAB, 4, activation="tanh"), OutputLayer(2)]
    return MultiLayerConfiguration(layers, updater=Sgd(1.0), seed=2)


def _sequence_conf() -> MultiLayerConfiguration:
    layers = [EmbeddingSequenceLayer(VOCAB, 4, activation="identity"), LastTimeStep(LSTM(5)), OutputLayer(2)]
    return MultiLayerConfiguration(
        layers, input_type=InputType.recurrent(1), updater=Sgd(2.0), activation="tanh", seed=2
    )


def _sequences(rng, n: int) -> tuple[list[list[int]], np.ndarray]:
    """Sequences of 1-6 indices; class 1 when the last index is below VOCAB / 2."""
    seqs = [rng.integers(0, VOCAB, rng.integers(1, 7)).tolist() for _ in range(n)]
    return seqs, np.array([float(s[-1] < VOCAB // 2) for s in seqs])


def _padded(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    steps = max(map(len, seqs))
    x = np.zeros((len(seqs), 1, steps), dtype=np.int64)
    mask = np.zeros((len(seqs), steps), dtype=np.float32)
    for i, s in enumerate(seqs):
        x[i, 0, : len(s)], mask[i, : len(s)] = s, 1
    return x, mask


def test_index_columns_become_int64_indices_and_sequences_masks(spark) -> None:
    rng = np.random.default_rng(1)
    words = rng.integers(0, VOCAB, 10)
    df = spark.createDataFrame([(int(w), float(w % 2)) for w in words], ["features", "label"]).coalesce(1)
    (ds,) = dataframe_datasets(df, "features", "label", _word_conf(), 16).collect()
    assert ds.features.dtype == np.int64
    np.testing.assert_array_equal(ds.features, words[:, None])
    # StringIndexer writes doubles: taken when they hold integers
    df = spark.createDataFrame([(float(w), 0.0) for w in words], ["features", "label"]).coalesce(1)
    (ds,) = dataframe_datasets(df, "features", "label", _word_conf(), 16).collect()
    np.testing.assert_array_equal(ds.features, words[:, None])

    seqs, labels = _sequences(rng, 9)
    df = spark.createDataFrame(list(zip(seqs, labels.tolist())), ["features", "label"]).coalesce(1)
    parts = dataframe_datasets(df, "features", "label", _sequence_conf(), 4).collect()
    assert [p.num_examples() for p in parts] == [4, 4, 1]
    merged = DataSet.merge(parts)
    x, mask = _padded(seqs)
    np.testing.assert_array_equal(merged.features[..., : x.shape[2]], x)
    np.testing.assert_array_equal(merged.features_mask[:, : x.shape[2]], mask)
    assert not merged.features_mask[:, x.shape[2] :].any()


def test_fit_dataframe_of_index_sequences_learns_and_the_model_transforms_them(spark) -> None:
    rng = np.random.default_rng(2)
    seqs, labels = _sequences(rng, 256)
    schema = T.StructType(
        [T.StructField("tokens", T.ArrayType(T.IntegerType())), T.StructField("label", T.DoubleType())]
    )
    df = spark.createDataFrame(list(zip(seqs, labels.tolist())), schema).repartition(2)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, rdd_data_set_num_examples=16, averaging_frequency=2, rng_seed=5
    )
    x, mask = _padded(seqs)
    ds = DataSet(x, np.eye(2, dtype=np.float32)[labels.astype(int)], features_mask=mask)
    with SparkMultiLayer(spark, _sequence_conf(), master) as spark_net:
        before = spark_net.network.score(ds)
        net = spark_net.fit(df, epochs=6, features_col="tokens")
    assert net.score(ds) < 0.5 * before
    model = SparkgradClassificationModel(net).setFeaturesCol("tokens")
    rows = model.transform(df.coalesce(1)).select("tokens", "probability").collect()
    x, mask = _padded([r[0] for r in rows])
    expected = net.output(x, features_mask=mask)
    np.testing.assert_allclose([r[1].toArray() for r in rows], expected, rtol=0, atol=OUTPUT_TOL)
    # one example as an ml Vector of indices
    np.testing.assert_allclose(
        model.predictProbability(Vectors.dense(seqs[0])),
        net.output(np.array([[seqs[0]]]))[0],
        rtol=0,
        atol=OUTPUT_TOL,
    )


def test_classifier_over_an_integer_column(spark) -> None:
    rng = np.random.default_rng(3)
    words = rng.integers(0, VOCAB, 200)
    df = spark.createDataFrame([(int(w), float(w < 10)) for w in words], ["word", "label"])
    classifier = SparkgradClassifier(
        networkConf=_word_conf(),
        trainingMaster=ParameterAveragingTrainingMaster(
            averaging_frequency=4, repartition="never", rng_seed=3
        ),
        epochs=8,
        batchSize=20,
    ).setFeaturesCol("word")
    model = classifier.fit(df)
    rows = model.transform(df).select("word", "prediction", "label").collect()
    accuracy = np.mean([r[1] == r[2] for r in rows])
    assert accuracy > 0.9
    expected = model.network.output(np.array([[r[0]] for r in rows])).argmax(1)
    np.testing.assert_array_equal([r[1] for r in rows], expected)


def test_index_column_errors(spark) -> None:
    df = spark.createDataFrame([(1.5, 0.0), (2.0, 1.0)], ["features", "label"])
    with pytest.raises(Exception, match=r"features_col 'features': indices must be integers, found \[1\.5\]"):
        dataframe_datasets(df, "features", "label", _word_conf(), 4).collect()
    with pytest.raises(TypeError, match="embedding layer takes an array of indices per row"):
        dataframe_datasets(df, "features", "label", _sequence_conf(), 4)
    df = spark.createDataFrame([([1, 2], 0.0), ([], 1.0)], ["features", "label"])
    with pytest.raises(Exception, match="1 rows hold an empty sequence"):
        dataframe_datasets(df, "features", "label", _sequence_conf(), 4).collect()
    per_step = MultiLayerConfiguration(
        [EmbeddingSequenceLayer(VOCAB, 4), RnnOutputLayer(2)], input_type=InputType.recurrent(1)
    )
    with pytest.raises(ValueError, match="a label column holds one label per example"):
        dataframe_datasets(df, "features", "label", per_step, 4)
    pooled = MultiLayerConfiguration(
        [EmbeddingSequenceLayer(VOCAB, 4), GlobalPoolingLayer("avg"), OutputLayer(2)],
        input_type=InputType.recurrent(1, 3),
    )
    df = spark.createDataFrame([([1, 2, 3, 4], 0.0)], ["features", "label"])
    with pytest.raises(Exception, match="a sequence has 4 indices, the input type takes 3"):
        dataframe_datasets(df, "features", "label", pooled, 4).collect()
    net = MultiLayerNetwork(_word_conf()).init()
    df = spark.createDataFrame([(3, 0.0), (VOCAB, 0.0)], ["features", "label"])
    model = SparkgradClassificationModel(net)
    with pytest.raises(
        Exception,
        match=r"layers\[0\] \(EmbeddingLayer\)\.input: index 20 at position \d is outside \[0, 20\)",
    ):
        model.transform(df).collect()

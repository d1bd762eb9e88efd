"""SparkMultiLayer / SparkComputationGraph .fit(DataFrame) and predict(Vector/Matrix): the column
conversion and its errors; DL4J DataSet files read through Spark."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers import mlp_conf, port, subset
from pyspark.ml import linalg as ml
from pyspark.mllib import linalg as mllib
from pyspark.sql import types as T

from sparkgrad.data import DataSet, read_nd4j_dataset
from sparkgrad.errors import TrainingError
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    GlobalPoolingLayer,
    InputType,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
    VoidConfiguration,
)
from sparkgrad.spark.columns import REGRESSION, dataframe_datasets

# float32 outputs of the same network on the same rows, possibly in batches of other sizes
OUTPUT_TOL = 64 * float(np.finfo(np.float32).eps)


def _frame(spark, features: list, labels: list, feature_type=None, label_type=None, partitions: int = 2):
    schema = T.StructType(
        [
            T.StructField("features", feature_type or ml.VectorUDT()),
            T.StructField("label", label_type or T.DoubleType()),
        ]
    )
    return spark.createDataFrame(list(zip(features, labels)), schema).repartition(partitions)


def test_conversion_keeps_rows_in_order_in_datasets_of_the_unit_size(spark, digits) -> None:
    train = subset(digits[0], 90)
    x, classes = train.features, train.labels.argmax(1)
    # dense and sparse Vectors mixed, one partition so that the order is the input order
    vectors = [
        ml.Vectors.dense(r) if i % 2 else ml.Vectors.sparse(64, dict(enumerate(r))) for i, r in enumerate(x)
    ]
    df = spark.createDataFrame(
        [(v, float(c)) for v, c in zip(vectors, classes)], ["features", "label"]
    ).coalesce(1)
    parts = dataframe_datasets(df, "features", "label", mlp_conf(), 16).collect()
    assert [p.num_examples() for p in parts] == [16] * 5 + [10]
    merged = DataSet.merge(parts)
    assert merged.features.dtype == np.float32
    np.testing.assert_array_equal(merged.features, x)
    np.testing.assert_array_equal(merged.labels, np.eye(10, dtype=np.float32)[classes])


def test_images_arrays_and_vector_labels_are_reshaped_for_the_network(spark, digits) -> None:
    train = subset(digits[0], 40)
    conf = MultiLayerConfiguration(
        [ConvolutionLayer(4, kernel_size=(3, 3)), OutputLayer(10)],
        input_type=InputType.convolutional(8, 8, 1),
        seed=3,
    )
    ints = np.rint(train.features * 16).astype(np.int64)  # an array<bigint> column is cast too
    df = _frame(
        spark,
        [r.tolist() for r in ints],
        [mllib.Vectors.dense(r) for r in train.labels],
        T.ArrayType(T.LongType()),
        mllib.VectorUDT(),
        partitions=1,
    )
    merged = DataSet.merge(dataframe_datasets(df, "features", "label", conf, 8).collect())
    assert merged.features.shape == (40, 1, 8, 8)
    np.testing.assert_array_equal(merged.features, ints.reshape(40, 1, 8, 8).astype(np.float32))
    np.testing.assert_array_equal(merged.labels, train.labels)


def test_fit_dataframe_trains_exactly_like_the_same_datasets(spark, digits) -> None:
    train = subset(digits[0], 128)
    master = {
        "batch_size_per_worker": 16,
        "rdd_data_set_num_examples": 16,
        "averaging_frequency": 4,
        "rng_seed": 5,
    }
    # createDataFrame and parallelize both cut local data into 2 contiguous halves of 4 DataSets
    df = spark.createDataFrame(
        [(ml.Vectors.dense(r), float(c)) for r, c in zip(train.features, train.labels.argmax(1))],
        ["features", "label"],
    )
    assert df.rdd.getNumPartitions() == 2
    rdd = spark.sparkContext.parallelize(train.split(16), 2)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), ParameterAveragingTrainingMaster(**master)) as a:
        a.fit(df, epochs=2)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), ParameterAveragingTrainingMaster(**master)) as b:
        b.fit(rdd, epochs=2)
    assert a.network.iteration_count == b.network.iteration_count > 0
    np.testing.assert_array_equal(a.network.params(), b.network.params())


def test_column_errors_name_the_column(spark, digits) -> None:
    train = subset(digits[0], 20)
    df = spark.createDataFrame(
        [(ml.Vectors.dense(r), float(c), "x") for r, c in zip(train.features, train.labels.argmax(1))],
        ["features", "label", "text"],
    )
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8))
    with pytest.raises(ValueError, match="features_col: no column 'pixels'"):
        sm.fit(df, features_col="pixels")
    with pytest.raises(TypeError, match="label_col: column 'text' has type string"):
        sm.fit(df, label_col="text")
    with pytest.raises(ValueError, match="holds one number per row but the network has 10 outputs"):
        dataframe_datasets(df, "features", "label", mlp_conf(), 4, REGRESSION)
    per_step = MultiLayerConfiguration([OutputLayer(2)], input_type=InputType.recurrent(3))
    with pytest.raises(ValueError, match=r"sequences in, recurrent\(2\) out: a label column holds one label"):
        SparkMultiLayer(spark, per_step).fit(df)
    pooled = MultiLayerConfiguration(
        [GlobalPoolingLayer("avg"), OutputLayer(2)], input_type=InputType.recurrent(3)
    )
    with pytest.raises(TypeError, match="has type vector, but the network takes sequences"):
        SparkMultiLayer(spark, pooled).fit(df)
    # df.rdd holds Rows: the message says to pass the DataFrame itself
    with pytest.raises(
        TypeError,
        match=r"found elements of type Row; to train on a DataFrame, pass the DataFrame itself: "
        r"fit\(df, features_col=\.\.\., label_col=\.\.\.\)",
    ):
        sm.fit(df.rdd)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [([1.0] * 64, 10.0)],
            r"label_col 'label': class labels must be integers in \[0, 10\), found \[10\.\]",
        ),
        (
            [([1.0] * 64, 1.5)],
            r"label_col 'label': class labels must be integers in \[0, 10\), found \[1\.5\]",
        ),
        ([([1.0] * 63, 1.0)], r"features_col 'features': 1 rows do not have 64 values \(one has 63\)"),
        ([(None, 1.0)], r"features_col 'features': 1 rows are null"),
        ([([1.0] * 64, None)], r"label_col 'label': 1 labels are null"),
    ],
)
def test_bad_values_fail_the_job_with_the_column_in_the_message(spark, rows, message) -> None:
    good = [([0.0] * 64, 0.0)] * 3
    df = _frame(spark, *zip(*(good + rows)), T.ArrayType(T.DoubleType()), partitions=1)
    with pytest.raises(TrainingError, match=message):
        SparkMultiLayer(spark, mlp_conf(hidden=8)).fit(df)


def test_predict_vectors_and_matrices_of_both_linalg_modules(spark, digits) -> None:
    net = MultiLayerNetwork(mlp_conf(hidden=8)).init()
    sm = SparkMultiLayer(spark, net)
    x = digits[1].features[:5].astype(np.float64)
    expected = net.output(x).astype(np.float64)
    for linalg in (ml, mllib):
        one = sm.predict(linalg.Vectors.dense(x[0]))
        assert isinstance(one, linalg.DenseVector)
        np.testing.assert_allclose(one.toArray(), expected[0], rtol=0, atol=OUTPUT_TOL)
        sparse = sm.predict(linalg.Vectors.sparse(64, {i: v for i, v in enumerate(x[1]) if v}))
        np.testing.assert_allclose(sparse.toArray(), expected[1], rtol=0, atol=OUTPUT_TOL)
        matrix = sm.predict(linalg.DenseMatrix(5, 64, x.ravel(order="F")))  # column-major values
        assert isinstance(matrix, linalg.DenseMatrix) and (matrix.numRows, matrix.numCols) == (5, 10)
        np.testing.assert_allclose(matrix.toArray(), expected, rtol=0, atol=OUTPUT_TOL)
    with pytest.raises(ValueError, match="features: the vector has 3 values, the network takes 64"):
        sm.predict(ml.Vectors.dense([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="features: expected a pyspark.ml.linalg"):
        sm.predict(x)


def _digit_frame(spark, ds: DataSet, features_col: str, label_col: str):
    """``ds`` as a DataFrame of an ml Vector and a class index per row, in 2 contiguous partitions."""
    rows = [(ml.Vectors.dense(r), float(c)) for r, c in zip(ds.features, ds.labels.argmax(1))]
    df = spark.createDataFrame(rows, [features_col, label_col])
    assert df.rdd.getNumPartitions() == 2
    return df


def test_shared_training_fits_a_dataframe_with_other_column_names(spark, digits) -> None:
    train = subset(digits[0], 256)
    df = _digit_frame(spark, train, "x", "y")
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        rdd_data_set_num_examples=16,
        collect_training_stats=True,
        rng_seed=3,
    )
    with SparkMultiLayer(spark, mlp_conf(hidden=32), master) as sm:
        before = sm.network.score(train)
        net = sm.fit(df, features_col="x", label_col="y", epochs=2)
        examples = sum(
            e.extra["examples"] for e in sm.training_stats.events("SharedWorkerComputeUpdateTimesMs")
        )
    assert net.epoch_count == 2 and examples == 2 * train.num_examples()
    assert net.score(train) < 0.8 * before


def _single_graph_conf() -> ComputationGraphConfiguration:
    return (
        ComputationGraphConfiguration.builder(seed=6, updater=Adam(1e-2))
        .add_inputs("pixels")
        .set_input_types(InputType.feed_forward(64))
        .add_layer("hidden", DenseLayer(16, activation="relu"), "pixels")
        .add_layer("digit", OutputLayer(10), "hidden")
        .set_outputs("digit")
        .build()
    )


def test_single_input_graph_fits_a_dataframe_like_its_datasets_and_predicts_vectors(spark, digits) -> None:
    train = subset(digits[0], 128)
    master = {
        "batch_size_per_worker": 16,
        "rdd_data_set_num_examples": 16,
        "averaging_frequency": 4,
        "rng_seed": 5,
    }
    df = _digit_frame(spark, train, "x", "y")
    rdd = spark.sparkContext.parallelize(train.split(16), 2)
    start = ComputationGraph(_single_graph_conf()).init()
    with SparkComputationGraph(spark, start.clone(), ParameterAveragingTrainingMaster(**master)) as a:
        a.fit(df, features_col="x", label_col="y", epochs=2)
    with SparkComputationGraph(spark, start.clone(), ParameterAveragingTrainingMaster(**master)) as b:
        b.fit(rdd, epochs=2)
    assert a.network.iteration_count == b.network.iteration_count > 0
    np.testing.assert_array_equal(a.network.params(), b.network.params())
    assert not np.array_equal(a.network.params(), start.params())
    # predict: the graph's own output of the same rows (one example, or the matrix's batch)
    net = a.network
    x = digits[1].features[:5]
    (batch,) = net.output(x)
    (first,) = net.output(x[:1])
    for linalg in (ml, mllib):
        one = a.predict(linalg.Vectors.dense(x[0].astype(np.float64)))
        assert isinstance(one, linalg.DenseVector)
        np.testing.assert_array_equal(one.toArray(), first[0].astype(np.float64))
        matrix = a.predict(linalg.DenseMatrix(5, 64, x.astype(np.float64).ravel(order="F")))
        assert isinstance(matrix, linalg.DenseMatrix) and (matrix.numRows, matrix.numCols) == (5, 10)
        np.testing.assert_array_equal(matrix.toArray(), batch.astype(np.float64))


def test_graphs_with_several_inputs_name_them_for_dataframes(spark, digits) -> None:
    conf = (
        ComputationGraphConfiguration.builder(seed=1)
        .add_inputs("left", "right")
        .set_input_types(InputType.feed_forward(32), InputType.feed_forward(32))
        .add_vertex("merge", MergeVertex(), "left", "right")
        .add_layer("digit", OutputLayer(10), "merge")
        .set_outputs("digit")
        .build()
    )
    df = _digit_frame(spark, subset(digits[0], 20), "features", "label")
    message = (
        r"network: the graph has inputs \['left', 'right'\] and outputs \['digit'\].*one features column"
    )
    with SparkComputationGraph(spark, conf) as model:
        with pytest.raises(ValueError, match=message):
            model.fit(df)
        with pytest.raises(ValueError, match=message):
            model.fit_dataframe(df)
        with pytest.raises(ValueError, match=message):
            model.predict(ml.Vectors.dense([0.0] * 64))


def test_dense_network_over_image_vectors_and_regression_targets(spark) -> None:
    # two outputs, targets as an array column: the regression path of fit(df)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = np.stack([x.sum(1), x[:, 0] - x[:, 1]], axis=1)
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(2, activation="identity", loss="mse")],
        input_type=InputType.feed_forward(4),
        seed=2,
    )
    df = _frame(
        spark,
        [ml.Vectors.dense(r) for r in x],
        [r.tolist() for r in y],
        label_type=T.ArrayType(T.FloatType()),
    )
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, rdd_data_set_num_examples=8, rng_seed=1
    )
    with SparkMultiLayer(spark, conf, master) as sm:
        before = sm.network.score(DataSet(x, y))
        sm.fit(df, epochs=3)
        assert sm.network.score(DataSet(x, y)) < before


def _nd4j_float_array(a: np.ndarray) -> bytes:
    """Nd4j.write of a C-order float32 array (dl4j-reference.md 6.1): shape info, then the elements."""

    def utf(text: str) -> bytes:
        return struct.pack(">H", len(text)) + text.encode("ascii")

    strides = [s // 4 for s in np.ascontiguousarray(a, np.float32).strides]
    info = [a.ndim, *a.shape, *strides, 0, 1, ord("c")]
    head = (
        utf("MIXED_DATA_TYPES") + struct.pack(">q", len(info)) + utf("LONG") + np.array(info, ">i8").tobytes()
    )
    data = utf("MIXED_DATA_TYPES") + struct.pack(">q", a.size) + utf("FLOAT") + a.astype(">f4").tobytes()
    return head + data


def test_dl4j_dataset_files_read_through_binary_files(spark, digits, tmp_path) -> None:
    parts = subset(digits[0], 24).split(8)
    for i, part in enumerate(parts):  # DataSet.save: flags (features, labels), then both arrays
        data = b"\x03" + _nd4j_float_array(part.features) + _nd4j_float_array(part.labels)
        (tmp_path / f"dataset_{i}.bin").write_bytes(data)
    read = spark.sparkContext.binaryFiles(tmp_path.as_uri()).map(read_nd4j_dataset).collect()
    assert len(read) == len(parts)
    for want in parts:  # binaryFiles does not promise an order
        matches = [got for got in read if np.array_equal(got.features, want.features)]
        assert len(matches) == 1
        np.testing.assert_array_equal(matches[0].labels, want.labels)

"""DataFrame columns and MLlib vectors/matrices as network inputs and outputs.

One conversion serves ``SparkMultiLayer.fit(dataframe)``, the :mod:`sparkgrad.ml` estimators and
their models' ``transform``: the driver checks the columns' types and turns them into numeric arrays
on the JVM (``vector_to_array`` for Vector columns, a cast for array and number columns); the
executors receive them as Arrow record batches (``mapInArrow`` for training, a scalar ``arrow_udf`` of
the features alone for ``transform``) and convert each batch with a few vectorised NumPy operations,
never row by row. Features of one example are reshaped to what the
network's input type takes (``(channels, height, width)`` for convolutional input); labels are class
indices (one-hot encoded here), or a Vector/array of one value per network output. A ComputationGraph
takes part when it has one input and one output (one features column, one label column).

A network whose input layer is an embedding layer takes indices: an EmbeddingLayer one integer per row
(a number column: integer types stay exact int64; floating ones, as StringIndexer writes, must hold
integers), an EmbeddingSequenceLayer an array of integers per row, of any length: each batch is padded
with index 0 to its longest sequence (or the input type's fixed length) and the lengths become the
features mask. A network with recurrent input of values (``InputType.recurrent(size)``, a time series)
takes an array per row of any length whose elements are the time steps, each an array (or a Vector) of
``size`` numbers; batches are padded with zeros and masked the same way. Either sequence form needs a
feed-forward output (one label per row: LastTimeStep, global pooling).

Needs pyarrow and pyspark 4.1 or later, as the ``spark`` extra pins them (``transform`` uses
``arrow_udf``, new in pyspark 4.1; :mod:`sparkgrad.ml` checks the version when imported).
"""

from __future__ import annotations

import math
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sparkgrad.data import rebatch
from sparkgrad.spark.threads import in_task_threads

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import RDD
    from pyspark.sql import Column, DataFrame
    from typing_extensions import TypeIs

    from sparkgrad.nn import ComputationGraphConfiguration, InputType, MultiLayerConfiguration

    NetworkConfiguration = MultiLayerConfiguration | ComputationGraphConfiguration

# examples per output record batch of the DataFrame -> DataSet conversion
_RECORD_EXAMPLES = 4096
# examples per forward pass in transform: bounds the activations' memory for large images
PREDICT_CHUNK = 512
CLASSIFICATION = "classification"
REGRESSION = "regression"
# what an embedding layer reading the network input takes per row (index_input)
INDICES = "indices"
INDEX_SEQUENCES = "index_sequences"
# what a network with recurrent input of values takes per row (input_form)
SEQUENCES = "sequences"


def is_dataframe(value: object) -> TypeIs[DataFrame]:
    """True for a pyspark DataFrame (without importing pyspark.sql for other values)."""
    return type(value).__name__ == "DataFrame" and type(value).__module__.startswith("pyspark.sql")


def _single_io(conf: NetworkConfiguration) -> tuple[InputType | None, int]:
    """The input type (None: a MultiLayerConfiguration sized by its first layer's ``n_in``) and the
    output size of the network built from ``conf``, which must have one input and one output.

    Raises:
        ValueError: a graph with several inputs or outputs (names them).
    """
    from sparkgrad.nn import MultiLayerConfiguration

    if isinstance(conf, MultiLayerConfiguration):  # one input, one output
        return conf.input_type, int(conf.output_type.size)
    if len(conf.inputs) != 1 or len(conf.outputs) != 1:
        raise ValueError(
            f"network: the graph has inputs {conf.inputs} and outputs {conf.outputs}, but DataFrame and "
            "MLlib data map to one features column and one label column (one input, one output); train "
            "a graph with several on an RDD of MultiDataSets"
        )
    return conf.input_types[0], int(conf.output_types[conf.outputs[0]].size)


def index_input(conf: NetworkConfiguration) -> str | None:
    """:data:`INDICES` when the network's input is an EmbeddingLayer's, :data:`INDEX_SEQUENCES` when it is
    an EmbeddingSequenceLayer's, else None.

    Raises:
        ValueError: a graph with several inputs or outputs, or index sequences into recurrent output
            (a column holds one label per example, not one per step).
    """
    from sparkgrad.nn import EmbeddingSequenceLayer, FrozenLayer, MultiLayerConfiguration

    _single_io(conf)
    if isinstance(conf, MultiLayerConfiguration):
        layer, output = conf.layers[0], conf.output_type
    else:
        layer, output = conf.index_readers.get(conf.inputs[0]), conf.output_types[conf.outputs[0]]
    if layer is None or not layer.takes_indices:
        return None
    if not isinstance(layer.layer if isinstance(layer, FrozenLayer) else layer, EmbeddingSequenceLayer):
        return INDICES
    _one_label_per_sequence(output, "index sequences")
    return INDEX_SEQUENCES


def _one_label_per_sequence(output: InputType, inputs: str) -> None:
    if output.kind == "recurrent":
        raise ValueError(
            f"network: {inputs} in, {output.describe()} out: a label column holds one label per "
            "example, not one per step; end the network in a feed-forward output (LastTimeStep, global "
            "pooling) or train on an RDD of DataSets with (batch, n_out, time) labels"
        )


def input_form(conf: NetworkConfiguration) -> str | None:
    """What a features column holds per row for a network built from ``conf``: :data:`INDICES` or
    :data:`INDEX_SEQUENCES` (:func:`index_input`), :data:`SEQUENCES` for recurrent input of values
    (time steps of ``size`` numbers), or None for one fixed-size example (:func:`example_shape`).

    Raises:
        ValueError: a graph with several inputs or outputs, or sequences into recurrent output.
    """
    from sparkgrad.nn import MultiLayerConfiguration

    indices = index_input(conf)
    if indices is not None:
        return indices
    it, _ = _single_io(conf)
    if it is None or it.kind != "recurrent":
        return None
    output = (
        conf.output_type if isinstance(conf, MultiLayerConfiguration) else conf.output_types[conf.outputs[0]]
    )
    _one_label_per_sequence(output, "sequences")
    return SEQUENCES


def example_shape(conf: NetworkConfiguration) -> tuple[int, ...]:
    """Shape of one example's features as a network built from ``conf`` takes them from a column.

    Raises:
        ValueError: recurrent input (sequences of any length have no fixed shape: a column holds them as
            arrays of time steps, see :func:`input_form`), or a graph with several inputs or outputs.
    """
    it, _ = _single_io(conf)
    if it is None:  # only a MultiLayerConfiguration has none: its first layer's n_in (1 for indices)
        return cast("MultiLayerConfiguration", conf).layer_input_types[0].shape()
    if it.kind == "recurrent":
        raise ValueError(
            f"network: recurrent input {it.describe()} has no fixed example shape; a DataFrame column "
            "holds one sequence per row as an array of time steps"
        )
    return it.shape() if it.kind == "convolutional" else (it.size,)


def values_per_example(conf: NetworkConfiguration) -> int:
    """Values per example of a features column for a network built from ``conf``: the example's
    (:func:`example_shape`), one per index, and per time step for sequences (indices: 1).

    Raises:
        ValueError: a graph with several inputs or outputs.
    """
    form = input_form(conf)
    if form in (INDICES, INDEX_SEQUENCES):
        return 1
    if form == SEQUENCES:
        return int(_single_io(conf)[0].size)  # type: ignore[union-attr]  # sequences: recurrent input
    return math.prod(example_shape(conf))


def output_size(conf: NetworkConfiguration) -> int:
    """Values per example of the output of a network built from ``conf`` (one input, one output).

    Raises:
        ValueError: a graph with several inputs or outputs.
    """
    return _single_io(conf)[1]


def network_output(network: Any, x: np.ndarray, mask: np.ndarray | None = None) -> Any:
    """Output of a network with one output (a MultiLayerNetwork, or a graph's only output) for ``x`` and
    its features mask ``mask`` (index sequences)."""
    from sparkgrad.nn import MultiLayerNetwork

    if mask is None:
        out = network.output(x)
    elif isinstance(network, MultiLayerNetwork):
        out = network.output(x, features_mask=mask)
    else:
        out = network.output(x, features_masks=[mask])
    return out[0] if isinstance(out, list) else out


def _col(name: str) -> Column:
    """The top-level column ``name`` (dots and backticks in the name taken literally)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _field(df: DataFrame, name: Any, what: str) -> Any:
    if not isinstance(name, str):
        raise TypeError(f"{what}: expected a column name, got {type(name).__name__}")
    for field in df.schema.fields:
        if field.name == name:
            return field
    raise ValueError(f"{what}: no column {name!r} in the DataFrame (columns: {', '.join(df.columns)})")


def _is_vector(data_type: Any) -> bool:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT

    return isinstance(data_type, (VectorUDT, MLlibVectorUDT))


def _spark_float(dtype: str) -> Any:
    from pyspark.sql import types as T

    return T.FloatType() if dtype == "float32" else T.DoubleType()


def features_column(df: DataFrame, name: str, dtype: str, what: str, form: str | None = None) -> Column:
    """Column ``name`` of ``df`` (a Vector or an array of numbers) as an array of ``dtype`` values; for
    the ``form`` (:func:`input_form`) INDICES a number column, for INDEX_SEQUENCES an array of numbers,
    as longs when integer-typed and as doubles otherwise (checked to be integers on the executors); for
    SEQUENCES an array of time steps, each an array of numbers or a Vector, as arrays of arrays of
    ``dtype`` values.

    Raises:
        ValueError: no such column.
        TypeError: the column holds something else.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    data_type = _field(df, name, what).dataType
    if form == SEQUENCES:
        step = data_type.elementType if isinstance(data_type, T.ArrayType) else None
        if _is_vector(step):
            return F.transform(_col(name), lambda v: vector_to_array(v, dtype))
        if isinstance(step, T.ArrayType) and isinstance(step.elementType, T.NumericType):
            return _col(name).cast(T.ArrayType(T.ArrayType(_spark_float(dtype))))
        raise TypeError(
            f"{what}: column {name!r} has type {data_type.simpleString()}, but the network takes "
            "sequences: an array per row of time steps, each an array of numbers or a Vector"
        )
    if form is not None:
        array = isinstance(data_type, T.ArrayType)
        element = data_type.elementType if array else data_type
        exact = T.LongType() if isinstance(element, T.IntegralType) else T.DoubleType()
        if isinstance(element, T.NumericType) and array == (form == INDEX_SEQUENCES):
            return _col(name).cast(T.ArrayType(exact) if array else exact)
        if form == INDICES and _is_vector(data_type):
            return vector_to_array(_col(name), "float64")
        wanted = "an array of indices per row" if form == INDEX_SEQUENCES else "one index (a number) per row"
        raise TypeError(
            f"{what}: column {name!r} has type {data_type.simpleString()}, but the network's embedding "
            f"layer takes {wanted}"
        )
    if _is_vector(data_type):
        return vector_to_array(_col(name), dtype)
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.NumericType):
        return _col(name).cast(T.ArrayType(_spark_float(dtype)))
    raise TypeError(
        f"{what}: column {name!r} has type {data_type.simpleString()}, expected a Vector or an array of "
        "numbers (VectorAssembler builds a Vector column from number columns)"
    )


def labels_column(df: DataFrame, name: str, dtype: str, n_out: int, task: str, what: str) -> Column:
    """Column ``name`` as what :func:`label_matrix` reads: a double per row or an array of ``dtype``.

    Args:
        df: the DataFrame.
        name: the label column: numbers (class indices for classification, the value for regression)
            or a Vector / array of ``n_out`` values per row.
        dtype: the network's dtype.
        n_out: the network's outputs.
        task: :data:`CLASSIFICATION` or :data:`REGRESSION`.
        what: the argument name for messages.

    Raises:
        ValueError: no such column, or numbers for a regression with several outputs.
        TypeError: the column holds something else.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import types as T

    data_type = _field(df, name, what).dataType
    if _is_vector(data_type):
        return vector_to_array(_col(name), dtype)
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.NumericType):
        return _col(name).cast(T.ArrayType(_spark_float(dtype)))
    if isinstance(data_type, T.NumericType):
        if task == REGRESSION and n_out != 1:
            raise ValueError(
                f"{what}: column {name!r} holds one number per row but the network has {n_out} outputs; "
                f"use a Vector or array column of {n_out} values"
            )
        return _col(name).cast(T.DoubleType())
    raise TypeError(
        f"{what}: column {name!r} has type {data_type.simpleString()}, expected numbers or a Vector / "
        "array of numbers"
    )


def arrow_rows(column: pa.Array | pa.ChunkedArray, width: int, dtype: str, what: str) -> np.ndarray:
    """A list column of ``width`` numbers per row as an ``(rows, width)`` array of ``dtype``.

    Raises:
        ValueError: null rows or values, or rows of another length.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"{what}: {column.null_count} rows are null")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        raise ValueError(
            f"{what}: {wrong.size} rows do not have {width} values (one has {lengths[wrong[0]]}); "
            f"the network takes {width} per example"
        )
    values = column.flatten()
    if values.null_count:
        raise ValueError(f"{what}: {values.null_count} values inside the arrays are null")
    return values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(column), width)


def _index_values(values: np.ndarray, what: str) -> np.ndarray:
    """Indices as int64: integer values as they are, floating ones only when they hold integers."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(values) & (values == np.floor(values)) & (np.abs(values) < 2.0**63))
    if bad.any():
        raise ValueError(f"{what}: indices must be integers, found {values[bad][:5]}")
    return values.astype(np.int64)


def network_features(
    column: pa.Array | pa.ChunkedArray, conf: NetworkConfiguration, what: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """A record batch's features column (as :func:`features_column` made it) as the network's input and
    its features mask: ``(rows, *example_shape)`` values and None; for INDICES ``(rows, 1)`` int64 and
    None; for INDEX_SEQUENCES ``(rows, 1, time)`` int64 and for SEQUENCES ``(rows, size, time)`` values,
    padded with 0 to the batch's longest sequence (or the input type's fixed length), with the
    ``(rows, time)`` mask of the lengths.

    Raises:
        ValueError: nulls, rows or time steps of another length, indices that are not integers, empty
            sequences or sequences longer than the input type's fixed length.
    """
    import pyarrow as pa

    form = input_form(conf)
    if form is None:
        shape = example_shape(conf)
        return arrow_rows(column, math.prod(shape), conf.dtype, what).reshape(-1, *shape), None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if form == INDICES:
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):  # a Vector of 1 value
            return _index_values(arrow_rows(column, 1, "float64", what), what), None
        if column.null_count:
            raise ValueError(f"{what}: {column.null_count} rows are null")
        return _index_values(column.to_numpy(zero_copy_only=False), what).reshape(-1, 1), None
    it = _single_io(conf)[0]
    assert it is not None  # sequences: the input type is recurrent
    noun = "indices" if form == INDEX_SEQUENCES else "time steps"
    steps, present = _sequence_lengths(column, it.time_steps, noun, what)
    values = column.flatten()
    if values.null_count:
        raise ValueError(f"{what}: {values.null_count} {noun} inside the arrays are null")
    mask = present.astype(conf.dtype)
    if form == INDEX_SEQUENCES:
        x = np.zeros((len(column), steps), dtype=np.int64)
        x[present] = _index_values(values.to_numpy(zero_copy_only=False), what)  # row by row, in order
        return x[:, None, :], mask
    x = np.zeros((len(column), steps, it.size), dtype=conf.dtype)
    x[present] = arrow_rows(values, it.size, conf.dtype, f"{what} (a time step)")
    return np.ascontiguousarray(x.transpose(0, 2, 1)), mask


def _sequence_lengths(column: pa.Array, fixed: int | None, noun: str, what: str) -> tuple[int, np.ndarray]:
    """``(steps, present)`` of a list column of sequences: the padded length (``fixed``, else the longest)
    and the ``(rows, steps)`` boolean mask of each row's elements.

    Raises:
        ValueError: null rows, empty sequences, or sequences longer than ``fixed``.
    """
    import pyarrow.compute as pc

    if column.null_count:
        raise ValueError(f"{what}: {column.null_count} rows are null")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"{what}: {int((lengths < 1).sum())} rows hold an empty sequence")
    if fixed is not None and lengths.size and lengths.max() > fixed:
        raise ValueError(f"{what}: a sequence has {lengths.max()} {noun}, the input type takes {fixed}")
    steps = fixed or (int(lengths.max()) if lengths.size else 1)
    return steps, np.arange(steps)[None, :] < lengths[:, None]


def label_matrix(
    column: pa.Array | pa.ChunkedArray, n_out: int, task: str, dtype: str, what: str
) -> np.ndarray:
    """Labels of a record batch as the network's ``(rows, n_out)`` targets.

    A list column is taken as is (``n_out`` values per row). Numbers are, for classification, class
    indices, one-hot encoded (``n_out`` 1: a binary 0/1 label used as is) and, for regression, the
    value of the single output.

    Raises:
        ValueError: nulls, rows of another length, or class indices that are not integers in range.
    """
    import pyarrow as pa

    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return arrow_rows(column, n_out, dtype, what)
    if column.null_count:
        raise ValueError(f"{what}: {column.null_count} labels are null")
    values = column.to_numpy(zero_copy_only=False)
    if task == REGRESSION:
        if not np.isfinite(values).all():
            raise ValueError(f"{what}: labels must be finite, found {values[~np.isfinite(values)][:5]}")
        return values.astype(dtype).reshape(-1, 1)
    classes = max(n_out, 2)
    with np.errstate(invalid="ignore"):  # NaN compares False: reported below, not warned about
        bad = ~((values >= 0) & (values < classes) & (values == np.floor(values)))
    if bad.any():
        raise ValueError(f"{what}: class labels must be integers in [0, {classes}), found {values[bad][:5]}")
    if n_out == 1:
        return values.astype(dtype).reshape(-1, 1)
    return np.eye(n_out, dtype=dtype)[values.astype(np.int64)]


def _map_in_arrow(df: DataFrame, fn: Callable[[Iterator[Any]], Iterator[Any]], schema: Any) -> DataFrame:
    """``df.mapInArrow(fn, schema)``; pyspark's warning about pandas 3 is dropped: this path does not use
    pandas (pyspark only checks that it is installed)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        return df.mapInArrow(fn, schema)


def dataframe_datasets(
    df: DataFrame,
    features_col: str,
    label_col: str,
    conf: NetworkConfiguration,
    examples_per_dataset: int,
    task: str | None = None,
    names: tuple[str, str] = ("features_col", "label_col"),
) -> RDD:
    """The RDD of DataSets of :func:`dataframe_dataset_frame` (same arguments): what training on ``df``
    from a classic session uses."""
    from sparkgrad.data import DataSet

    converted = dataframe_dataset_frame(df, features_col, label_col, conf, examples_per_dataset, task, names)
    return converted.rdd.map(lambda row: DataSet.from_bytes(row[0], source="DataFrame conversion"))


def dataframe_dataset_frame(
    df: DataFrame,
    features_col: str,
    label_col: str,
    conf: NetworkConfiguration,
    examples_per_dataset: int,
    task: str | None = None,
    names: tuple[str, str] = ("features_col", "label_col"),
) -> DataFrame:
    """The DataSets that training on ``df`` uses, ``examples_per_dataset`` examples each, serialized
    (``DataSet.to_bytes``) in the one binary column ``dataset`` of a DataFrame.

    Every partition of ``df`` becomes DataSets of its rows, in order (the last one of a partition may
    be smaller), converted per Arrow batch on the executors; nothing is collected to the driver.

    Args:
        df: the training DataFrame.
        features_col: a Vector or array column of the features, ``prod(example_shape(conf))`` values
            per row (an image's values in channels, height, width order); indices for an embedding
            input (see the module docstring).
        label_col: class indices or values (see :func:`label_matrix`), or a Vector/array column of
            one value per network output.
        conf: the network's configuration.
        examples_per_dataset: examples per DataSet of the result (the training master's
            ``rdd_data_set_num_examples``).
        task: :data:`CLASSIFICATION` or :data:`REGRESSION`; default classification for networks with
            several outputs, regression for one.
        names: how messages call the features and label column arguments.

    Returns:
        DataFrame of serialized DataSets.

    Raises:
        ValueError / TypeError: missing columns, columns of the wrong type, recurrent input (names
            the column or the network). Bad values (nulls, rows of another length, class indices out
            of range) fail the job that first reads them, with a message naming the column.
    """
    from pyspark.sql import types as T

    from sparkgrad.data import DataSet

    form = input_form(conf)
    n_out = output_size(conf)
    task = task or (CLASSIFICATION if n_out > 1 else REGRESSION)
    dtype = conf.dtype
    feature_what = f"{names[0]} {features_col!r}"
    label_what = f"{names[1]} {label_col!r}"
    selected = df.select(
        features_column(df, features_col, dtype, names[0], form).alias("features"),
        labels_column(df, label_col, dtype, n_out, task, names[1]).alias("labels"),
    )

    def batches_to_datasets(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        def datasets() -> Iterator[DataSet]:
            for batch in batches:
                x, mask = network_features(batch.column(0), conf, feature_what)
                labels = label_matrix(batch.column(1), n_out, task, dtype, label_what)
                yield DataSet(x, labels, features_mask=mask)

        records: list[bytes] = []
        for ds in rebatch(datasets(), examples_per_dataset):
            records.append(ds.to_bytes())
            if len(records) * examples_per_dataset >= _RECORD_EXAMPLES:
                yield pa.record_batch([pa.array(records, pa.binary())], names=["dataset"])
                records = []
        if records:
            yield pa.record_batch([pa.array(records, pa.binary())], names=["dataset"])

    return _map_in_arrow(
        selected, batches_to_datasets, T.StructType([T.StructField("dataset", T.BinaryType(), False)])
    )


def with_network_outputs(
    df: DataFrame,
    features_col: str,
    conf: NetworkConfiguration,
    network_of: Callable[[], Any],
    outputs: Callable[[np.ndarray], dict[str, np.ndarray]],
    columns: list[tuple[str, bool]],
    task_threads: int | None = None,
) -> DataFrame:
    """``df`` with columns computed from the network's output appended, in vectorised batches.

    Args:
        df: the input DataFrame (all its columns are kept).
        features_col: the features column (as for :func:`dataframe_datasets`).
        conf: the network's configuration.
        network_of: called on an executor, returns the network (e.g. from a broadcast, cached there).
        outputs: ``outputs(network output of a batch)`` -> ``{column name: values}``, a 1-D array per
            number column and a 2-D array per vector column.
        columns: ``(name, is_vector)`` of the new columns, in order; vector columns become ml Vectors.
        task_threads: the native threads of the tasks (None: their CPUs; :mod:`sparkgrad.spark.threads`).

    Returns:
        The DataFrame (lazy: computed when an action runs).

    Raises:
        ValueError: an output column exists already, or a features column problem as in
            :func:`dataframe_datasets`.
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.functions import ArrowUDFType, arrow_udf  # pyspark 4.1+ (sparkgrad.ml checks it)

    for name, _ in columns:
        if name in df.columns:
            raise ValueError(f"output column {name!r} already exists in the DataFrame")
    form = input_form(conf)
    dtype = conf.dtype
    n_out = output_size(conf)
    what = f"featuresCol {features_col!r}"
    result_type = T.StructType(
        [
            T.StructField(name, T.ArrayType(T.DoubleType(), False) if vector else T.DoubleType(), False)
            for name, vector in columns
        ]
    )

    def predict(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        import pyarrow as pa

        net = network_of()
        for features in batches:
            x, mask = network_features(features, conf, what)
            chunks = [
                network_output(
                    net, x[i : i + PREDICT_CHUNK], None if mask is None else mask[i : i + PREDICT_CHUNK]
                )
                for i in range(0, len(x), PREDICT_CHUNK)
            ]
            values = outputs(np.concatenate(chunks) if chunks else np.empty((0, n_out)))
            arrays = []
            for name, vector in columns:
                v = np.ascontiguousarray(values[name], dtype=np.float64)
                if vector:
                    offsets = pa.array(np.arange(0, v.size + 1, v.shape[1], dtype=np.int32))
                    arrays.append(pa.ListArray.from_arrays(offsets, pa.array(v.ravel())))
                else:
                    arrays.append(pa.array(v))
            yield pa.StructArray.from_arrays(arrays, names=[n for n, _ in columns])

    # a scalar UDF: Spark sends only its argument (the features as an array) to Python and zips the
    # result back to the rows in the JVM, so the other columns never leave it and nothing is shuffled
    with warnings.catch_warnings():  # the function type is given, not read from (string) type hints
        warnings.filterwarnings(
            "ignore", message="It is preferred to specify type hints", category=UserWarning
        )
        # pyspark's overloads omit the struct result that Spark accepts for SCALAR_ITER
        network_udf = arrow_udf(  # type: ignore[call-overload]
            in_task_threads(task_threads, predict), result_type, ArrowUDFType.SCALAR_ITER
        )
    temp = f"__sparkgrad_outputs_{uuid.uuid4().hex}"
    column = features_column(df, features_col, dtype, "featuresCol", form)
    with_outputs = df.withColumn(temp, network_udf(column))
    field = F.col(temp)
    return with_outputs.select(
        *[_col(c) for c in df.columns],
        *[(array_to_vector(field[n]) if vector else field[n]).alias(n) for n, vector in columns],
    )


def with_example_scores(
    df: DataFrame,
    features_col: str,
    label_col: str,
    score_col: str,
    conf: NetworkConfiguration,
    network_of: Callable[[], Any],
    include_regularization_terms: bool,
    batch_size: int,
    task_threads: int | None = None,
) -> DataFrame:
    """``df`` with every row's score (its loss, plus the l1/l2 penalty when asked) added as the double
    column ``score_col``, computed on the executors in batches of ``batch_size`` rows (a scalar
    ``arrow_udf`` of the features and label columns, read as :func:`dataframe_datasets` reads them).

    Raises:
        ValueError: ``score_col`` exists already, or a column problem as in :func:`dataframe_datasets`.
    """
    from pyspark.sql import types as T
    from pyspark.sql.functions import ArrowUDFType, arrow_udf

    from sparkgrad.data import DataSet

    if score_col in df.columns:
        raise ValueError(f"score_col: column {score_col!r} already exists in the DataFrame")
    form = input_form(conf)
    n_out = output_size(conf)
    task = CLASSIFICATION if n_out > 1 else REGRESSION
    dtype = conf.dtype
    feature_what, label_what = f"features_col {features_col!r}", f"label_col {label_col!r}"

    def score(batches: Iterator[tuple[pa.Array, pa.Array]]) -> Iterator[pa.Array]:
        import pyarrow as pa

        net = network_of()
        for features, labels in batches:
            x, mask = network_features(features, conf, feature_what)
            y = label_matrix(labels, n_out, task, dtype, label_what)
            scores = [
                net.score_examples(
                    DataSet(
                        x[i : i + batch_size],
                        y[i : i + batch_size],
                        features_mask=None if mask is None else mask[i : i + batch_size],
                    ),
                    include_regularization_terms,
                )
                for i in range(0, len(x), batch_size)
            ]
            yield pa.array(np.concatenate(scores).astype(np.float64) if scores else np.empty(0))

    with warnings.catch_warnings():  # the function type is given, not read from (string) type hints
        warnings.filterwarnings(
            "ignore", message="It is preferred to specify type hints", category=UserWarning
        )
        score_udf = arrow_udf(in_task_threads(task_threads, score), T.DoubleType(), ArrowUDFType.SCALAR_ITER)
    features = features_column(df, features_col, dtype, "features_col", form)
    labels = labels_column(df, label_col, dtype, n_out, task, "label_col")
    return df.withColumn(score_col, score_udf(features, labels))


def linalg_rows(value: Any, conf: NetworkConfiguration, what: str) -> tuple[np.ndarray, bool, Any]:
    """An ml / mllib Vector (one example) or Matrix (rows = examples) as a batch the network takes; for
    recurrent input of values (SEQUENCES) either is one sequence: a Matrix of time steps x values, a
    Vector of one value per step.

    Returns:
        ``(batch, single, module)``: the features ``(n, *example_shape)`` in the network's dtype
            (indices in float64: ``(n, 1)``, or ``(n, 1, length)`` for index sequences; a sequence
            ``(1, size, length)``),
        whether ``value`` was one example, and the linalg module (``pyspark.ml.linalg`` or
        ``pyspark.mllib.linalg``) the result should be returned in.

    Raises:
        TypeError: not a Vector or Matrix.
        ValueError: a length that does not fit the network.
    """
    from pyspark.ml import linalg as ml
    from pyspark.mllib import linalg as mllib

    module = None
    for candidate in (ml, mllib):
        if isinstance(value, (candidate.Vector, candidate.Matrix)):
            module = candidate
    if module is None:
        raise TypeError(
            f"{what}: expected a pyspark.ml.linalg / pyspark.mllib.linalg Vector or Matrix, "
            f"got {type(value).__name__}"
        )
    single = isinstance(value, module.Vector)
    rows = np.atleast_2d(value.toArray())
    form = input_form(conf)
    if form == SEQUENCES:  # one sequence: a Matrix of (time steps, size), a Vector of steps of size 1
        size = _single_io(conf)[0].size  # type: ignore[union-attr]  # sequences: a recurrent input type
        steps = rows if not single else rows.T
        if steps.shape[1] != size:
            raise ValueError(
                f"{what}: a sequence's time steps have {steps.shape[1]} values, the network takes {size} "
                "(one sequence: a Matrix of time steps x values, or a Vector when there is one per step)"
            )
        return steps.T[None].astype(conf.dtype), True, module
    if form is not None:  # float64: exact indices (the layer checks that they are integers)
        return (rows if form == INDICES else rows[:, None, :]), single, module
    shape = example_shape(conf)
    width = math.prod(shape)
    if rows.shape[1] != width:
        kind = "the vector has" if single else "the matrix rows have"
        raise ValueError(f"{what}: {kind} {rows.shape[1]} values, the network takes {width} per example")
    return rows.astype(conf.dtype).reshape(-1, *shape), single, module


__all__ = [
    "CLASSIFICATION",
    "INDEX_SEQUENCES",
    "INDICES",
    "REGRESSION",
    "SEQUENCES",
    "dataframe_dataset_frame",
    "dataframe_datasets",
    "example_shape",
    "features_column",
    "index_input",
    "input_form",
    "is_dataframe",
    "label_matrix",
    "labels_column",
    "linalg_rows",
    "network_features",
    "network_output",
    "output_size",
    "values_per_example",
    "with_example_scores",
    "with_network_outputs",
]

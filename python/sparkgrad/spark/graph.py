"""SparkComputationGraph: a ComputationGraph on Spark (DL4J ``SparkComputationGraph``).

Everything runs through :class:`~sparkgrad.spark.network.SparkNetwork`, the code path every network
type shares: both training masters, Export/Direct data preparation, epochs per job, authentication and
MESH apply to graphs exactly as to MultiLayerNetworks. A graph trains on DataSets (one input and one
output), on DataFrames (one input and one output, as ``SparkMultiLayer.fit(df)``) and on
MultiDataSets; the ``*_multi_data_set`` methods are the DL4J names of the same operations for RDDs of
MultiDataSets. Every evaluation method takes ``output_index``, as ``ComputationGraph.evaluate`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.data import MultiDataSet, SerializedMultiDataSetLoader
from sparkgrad.spark.checkpoint import CheckpointConfig
from sparkgrad.spark.columns import is_dataframe
from sparkgrad.spark.network import EpochCallback, SparkNetwork, _FitRequest, example_ndim

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

    from sparkgrad.nn import ComputationGraph


class SparkComputationGraph(SparkNetwork["ComputationGraph"]):
    """A ComputationGraph trained and used on Spark; see :class:`SparkNetwork` for the methods shared
    with :class:`~sparkgrad.spark.SparkMultiLayer` (``fit``, ``fit_paths``, ``calculate_score``,
    ``score_examples``, ``predict``, training stats, ``close``), which accept RDDs of DataSets
    (single-input, single-output graphs) or of MultiDataSets, and DataFrames (``fit(df, features_col=,
    label_col=)``, single-input, single-output graphs). The evaluation methods are those of
    :class:`SparkNetwork` plus a keyword ``output_index``: the position in ``conf.outputs`` of the output
    evaluated (default 0, the first), as in ``ComputationGraph.evaluate``.

    Args:
        spark: SparkSession or SparkContext.
        graph_or_conf: a ComputationGraph, or a ComputationGraphConfiguration (a graph is built and
            initialised from it).
        training_master: ``SharedTrainingMaster`` or ``ParameterAveragingTrainingMaster``; default
            ``ParameterAveragingTrainingMaster()``.
    """

    _network_type = "ComputationGraph"

    def __init__(self, spark: Any, graph_or_conf: Any, training_master: Any = None) -> None:
        super().__init__(spark, graph_or_conf, training_master)

    # -- evaluation of one chosen output --------------------------------------------------------
    def _output_keywords(self, output_index: Any) -> dict[str, int]:
        """The graph's ``do_evaluation`` keywords that evaluate output ``output_index``, checked here on
        the driver (before any Spark job) as ``ComputationGraph.do_evaluation`` checks them."""
        self._network.conf.check_output_index(output_index)
        return {"output_index": output_index}

    def evaluate(
        self,
        data: RDD | DataFrame | str,
        labels_list: list[str] | None = None,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        loader: Any = None,
        *,
        features_col: str = "features",
        label_col: str = "label",
        output_index: int = 0,
    ) -> Any:
        """Classification evaluation of output ``output_index`` over ``data``; otherwise as
        :meth:`SparkNetwork.evaluate`."""
        keywords = self._output_keywords(output_index)
        columns = (features_col, label_col)
        return self._evaluate(data, labels_list, eval_num_workers, eval_batch_size, loader, keywords, columns)

    def evaluate_roc(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """Binary ROC of output ``output_index`` (exact when ``threshold_steps`` is 0) over ``rdd``."""
        from sparkgrad.eval import ROC

        keywords = self._output_keywords(output_index)
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, [ROC(threshold_steps)], keywords)[0]

    def evaluate_roc_multi_class(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """One-vs-all ROC per class of output ``output_index`` over ``rdd``."""
        from sparkgrad.eval import ROCMultiClass

        keywords = self._output_keywords(output_index)
        roc = ROCMultiClass(threshold_steps)
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, [roc], keywords)[0]

    def evaluate_regression(
        self,
        rdd: RDD | DataFrame,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        features_col: str = "features",
        label_col: str = "label",
        output_index: int = 0,
    ) -> Any:
        """Regression metrics per column of output ``output_index`` over ``rdd`` (or a DataFrame's
        ``features_col`` and ``label_col``, as :meth:`SparkNetwork.evaluate` reads them)."""
        from sparkgrad.eval import RegressionEvaluation

        keywords = self._output_keywords(output_index)
        data = self._evaluation_frame(rdd, (features_col, label_col)) if is_dataframe(rdd) else rdd
        regression = RegressionEvaluation()
        return self._evaluations(data, eval_num_workers, eval_batch_size, [regression], keywords)[0]

    def do_evaluation(
        self,
        rdd: RDD,
        eval_num_workers: int | None,
        eval_batch_size: int | None,
        *evaluations: Any,
        output_index: int = 0,
    ) -> list:
        """Several evaluations of output ``output_index`` in one pass over ``rdd``; otherwise as
        :meth:`SparkNetwork.do_evaluation`."""
        keywords = self._output_keywords(output_index)
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, evaluations, keywords)

    # -- MultiDataSet variants (DL4J names) -----------------------------------------------------
    def fit_multi_data_set(
        self,
        data: RDD | str,
        epochs: int = 1,
        epoch_callback: EpochCallback[ComputationGraph] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> ComputationGraph:
        """Train on an RDD of MultiDataSets, or a directory, file or glob (any URI Spark reads) holding
        an export of :func:`~sparkgrad.spark.export_minibatches` or MultiDataSets saved with
        ``MultiDataSet.save``, read by :func:`~sparkgrad.spark.read_saved`; otherwise as :meth:`fit`
        (``checkpoint`` and ``resume`` too).

        Returns:
            The trained graph.
        """
        request = _FitRequest.of(epochs, epoch_callback, checkpoint, resume)
        return self._fit_data(data, SerializedMultiDataSetLoader(), request)

    def fit_paths_multi_data_set(
        self,
        paths: RDD,
        loader: Any = None,
        epochs: int = 1,
        epoch_callback: EpochCallback[ComputationGraph] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> ComputationGraph:
        """Train on saved MultiDataSets named by an RDD of paths; with the default loader Spark reads
        the files (any URI it reads), as :meth:`fit_paths` says.

        Args:
            paths: RDD of path strings.
            loader: callable path -> MultiDataSet (default ``SerializedMultiDataSetLoader()``).
            epochs: passes over the data, a positive int.
            epoch_callback: called after every epoch, as in :meth:`fit` (True stops early).
            checkpoint: as in :meth:`fit`.
            resume: as in :meth:`fit`.

        Returns:
            The trained graph.
        """
        loader = SerializedMultiDataSetLoader() if loader is None else loader
        return self.fit_paths(paths, loader, epochs, epoch_callback, checkpoint=checkpoint, resume=resume)

    def calculate_score_multi_data_set(
        self, rdd: RDD, average: bool = True, minibatch_size: int = 64
    ) -> float:
        """Score (sum of the output losses plus the l1/l2 penalty) over an RDD of MultiDataSets."""
        return self.calculate_score(rdd, average, minibatch_size)

    def score_examples_multi_data_set(
        self, rdd: RDD, include_regularization_terms: bool = False, batch_size: int = 64
    ) -> RDD:
        """Per-example scores of an RDD of MultiDataSets, in its order (lazy RDD of floats)."""
        return self.score_examples(rdd, include_regularization_terms, batch_size)

    def score_examples_multi_data_set_with_key(
        self, pair_rdd: RDD, include_regularization_terms: bool = False, batch_size: int = 64
    ) -> RDD:
        """Per-example scores of ``(key, MultiDataSet of one example)`` pairs: RDD of ``(key, float)``."""
        return self.score_examples_with_key(pair_rdd, include_regularization_terms, batch_size)

    def evaluate_multi_data_set(
        self,
        data: RDD | str,
        labels_list: list[str] | None = None,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        loader: Any = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """Classification evaluation of output ``output_index`` over MultiDataSets (a directory, file or
        glob, read by :func:`~sparkgrad.spark.read_saved`, is loaded with
        ``SerializedMultiDataSetLoader()`` unless ``loader`` says otherwise); as :meth:`evaluate`."""
        if isinstance(data, str) and loader is None:
            loader = SerializedMultiDataSetLoader()
        return self.evaluate(
            data, labels_list, eval_num_workers, eval_batch_size, loader, output_index=output_index
        )

    def evaluate_roc_multi_data_set(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """Binary ROC of output ``output_index`` over an RDD of MultiDataSets."""
        return self.evaluate_roc(
            rdd, threshold_steps, eval_num_workers, eval_batch_size, output_index=output_index
        )

    def evaluate_roc_multi_class_multi_data_set(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """One-vs-all ROC of output ``output_index`` over an RDD of MultiDataSets."""
        return self.evaluate_roc_multi_class(
            rdd, threshold_steps, eval_num_workers, eval_batch_size, output_index=output_index
        )

    def evaluate_regression_multi_data_set(
        self,
        rdd: RDD,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        output_index: int = 0,
    ) -> Any:
        """Regression metrics of output ``output_index`` over an RDD of MultiDataSets."""
        return self.evaluate_regression(rdd, eval_num_workers, eval_batch_size, output_index=output_index)

    def do_evaluation_multi_data_set(
        self,
        rdd: RDD,
        eval_num_workers: int | None,
        eval_batch_size: int | None,
        *evaluations: Any,
        output_index: int = 0,
    ) -> list:
        """Several evaluations of output ``output_index`` in one pass over an RDD of MultiDataSets."""
        return self.do_evaluation(
            rdd, eval_num_workers, eval_batch_size, *evaluations, output_index=output_index
        )

    # -- inference ------------------------------------------------------------------------------
    def feed_forward_with_key(self, pair_rdd: RDD, batch_size: int = 64) -> RDD:
        """Graph outputs for every value, keyed like the input.

        Args:
            pair_rdd: RDD of ``(key, inputs)``: ``inputs`` is a tuple (or list) with one array per
                graph input, each one example or a batch of the same number of examples (a single-input
                graph also takes the bare array), or a MultiDataSet whose features and features masks
                are used (masks of recurrent inputs: (batch, time)).
            batch_size: examples per forward pass (values of the same shapes and mask presence are
                grouped up to this size).

        Returns:
            RDD of ``(key, outputs)``: a tuple with one array per graph output, holding one example's
            output for single examples, else the batch's.
        """
        self._check_rdd(pair_rdd, "pair_rdd")
        size = check_int("batch_size", batch_size, minimum=1)
        bc = self._broadcast(lazy=True)

        def part(it: Iterable[Any]) -> Iterator[tuple[Any, tuple[np.ndarray, ...]]]:
            net = bc.value.networks(1)[0]
            ndims = [example_ndim(t) for t in net.conf.input_types]
            pending: list[tuple[Any, list[np.ndarray], list[np.ndarray | None], bool]] = []

            def flush() -> Iterator[tuple[Any, tuple[np.ndarray, ...]]]:
                inputs = [np.concatenate([p[1][i] for p in pending]) for i in range(len(ndims))]
                masks = [
                    None if pending[0][2][i] is None else np.concatenate([p[2][i] for p in pending])
                    for i in range(len(ndims))
                ]
                outputs = net.output(*inputs, features_masks=masks)
                offset = 0
                for key, arrays, _, single in pending:
                    n = arrays[0].shape[0]
                    rows = slice(offset, offset + n)
                    yield key, tuple(out[offset] if single else out[rows] for out in outputs)
                    offset += n
                pending.clear()

            def groups_with(arrays: list[np.ndarray], masks: list[np.ndarray | None]) -> bool:
                first_arrays, first_masks = pending[0][1], pending[0][2]
                return all(a.shape[1:] == b.shape[1:] for a, b in zip(arrays, first_arrays)) and all(
                    (m is None) == (f is None) for m, f in zip(masks, first_masks)
                )

            for key, value in it:
                arrays, masks, single = _graph_inputs(key, value, ndims)
                if pending and (
                    not groups_with(arrays, masks)
                    or sum(p[1][0].shape[0] for p in pending) + arrays[0].shape[0] > size
                ):
                    yield from flush()
                pending.append((key, arrays, masks, single))
            if pending:
                yield from flush()

        return pair_rdd.mapPartitions(self._in_task(part))


def _graph_inputs(
    key: Any, value: Any, ndims: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray | None], bool]:
    """One keyed value as a batch per graph input, a mask (or None) per input, and whether it was a
    single example."""
    if isinstance(value, MultiDataSet):
        values, masks = list(value.features), list(value.features_masks or [None] * len(value.features))
    else:
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        masks = [None] * len(values)
    if len(values) != len(ndims):
        raise ValueError(
            f"pair_rdd: value of key {key!r} has {len(values)} arrays, the graph has {len(ndims)} inputs"
        )
    arrays = [np.asarray(v) for v in values]
    single = arrays[0].ndim == ndims[0]
    batched, batched_masks = [], []
    for i, (a, m, ndim) in enumerate(zip(arrays, masks, ndims)):
        a = a[None] if single else a
        if a.ndim != ndim + 1 or a.shape[0] != (1 if single else arrays[0].shape[0]):
            raise ValueError(
                f"pair_rdd: input {i} of key {key!r} has shape {arrays[i].shape}, expected "
                f"{'one example' if single else 'a batch'} of {ndim} dimensions per example, like input 0"
            )
        batched.append(a)
        batched_masks.append(None if m is None else (np.asarray(m)[None] if single else np.asarray(m)))
    return batched, batched_masks, single


__all__ = ["SparkComputationGraph"]

"""Logging fits to MLflow: :class:`MlflowLogger` (a fit listener) and :func:`autolog`.

Runs: a fit under an active run logs into it and leaves it open; otherwise the logger starts a run for
the fit, active during it (an ``epoch_callback`` may log into it too), and ends it when the fit ends:
FINISHED, or FAILED when the fit raised. Inside an autologged ``CrossValidator`` or
``TrainValidationSplit`` fit of a sparkgrad estimator every fit gets its own run nested under the tuning
run, as MLflow's Spark ML autologging does.
"""

from __future__ import annotations

import csv
import functools
import io
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkgrad.mlflow._flavor import log_model, network_of, require_mlflow
from sparkgrad.spark.tracking import FitListener, add_fit_listener, remove_fit_listener

if TYPE_CHECKING:
    from sparkgrad.spark.stats import SparkTrainingStats

_log = logging.getLogger(__name__)

STATS_ARTIFACT = "training_stats.html"
SEARCH_RESULTS_ARTIFACT = "search_results.csv"
MODEL_NAME = "model"
_MAX_PARAM_LENGTH = 6000  # MLflow's limit of a param value
_BATCH = 100  # params per log_batch call (MLflow's limit)
_KEY_CHARS = re.compile(r"[^\w\-. /]")

_lock = threading.Lock()
_autolog: MlflowLogger | None = None
_tuning_runs: list[str] = []  # run ids of the autologged tuning fits in progress, innermost last
_patched: dict[tuple[type, str], Any] = {}  # (class, method) -> the original


def flatten_params(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    """A configuration's ``to_dict()`` form as MLflow params: one ``prefix.path.to.field`` key per
    value (list items by index, ``@type`` as ``type``), None values left out, long values cut to
    MLflow's limit.

    Args:
        prefix: the key of ``value``.
        value: a mapping, list or scalar.
        out: where the params go.

    Returns:
        ``out``.
    """
    if isinstance(value, Mapping):
        if set(value) == {"@tuple"}:
            return flatten_params(prefix, value["@tuple"], out)
        for key, item in value.items():
            name = "type" if key == "@type" else _KEY_CHARS.sub("_", str(key))
            flatten_params(f"{prefix}.{name}", item, out)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            flatten_params(f"{prefix}.{i}", item, out)
    elif value is not None:
        out[prefix] = str(value)[:_MAX_PARAM_LENGTH]
    return out


def fit_params(model: Any, epochs: int) -> dict[str, str]:
    """The params of a fit: the network configuration (``network.*``), the training master's options
    (``master.*``), ``network_type``, ``num_params`` and ``epochs``."""
    network = model.network
    params = {
        "network_type": type(network).__name__,
        "num_params": str(int(network.num_params())),
        "epochs": str(int(epochs)),
    }
    flatten_params("network", network.conf.to_dict(), params)
    flatten_params("master", model.training_master.to_dict(), params)
    return params


class _Fit:
    """One observed fit: its run, whether this logger started it, and the master setting it changed."""

    def __init__(self, run_id: str, owned: bool, nested: bool, stats_turned_on: bool) -> None:
        self.run_id, self.owned, self.nested, self.stats_turned_on = run_id, owned, nested, stats_turned_on


class MlflowLogger(FitListener):
    """Logs the fits it observes to MLflow: the network configuration and the training master's options
    as params, every epoch's metrics (step = the network's epoch number) as the epoch ends, the training
    stats' HTML report as the artifact ``training_stats.html``, and the trained network as the model
    ``model`` (``sparkgrad`` and ``python_function`` flavors).

    Use it for one model with ``spark_net.add_fit_listener(MlflowLogger())``, or for every fit with
    :func:`autolog`. Runs are handled as the module docstring says.

    Args:
        log_models: log the trained network at the end of a successful fit (not in the nested runs of a
            tuning fit: the tuning run gets its best model).
        log_training_stats: collect the training stats during the fit (the training master's
            ``collect_training_stats`` is switched on for the fit when off) and log their HTML report.
        registered_model_name: register every logged model as a new version of this registered model.
    """

    def __init__(
        self,
        log_models: bool = True,
        log_training_stats: bool = True,
        registered_model_name: str | None = None,
    ) -> None:
        self.log_models = bool(log_models)
        self.log_training_stats = bool(log_training_stats)
        self.registered_model_name = registered_model_name
        self._fits: dict[int, _Fit] = {}

    def fit_started(self, model: Any, epochs: int) -> None:
        """Find or start the fit's run and log its params."""
        mlflow = require_mlflow()
        with _lock:
            parent = _tuning_runs[-1] if _tuning_runs else None
        active = mlflow.active_run()
        if parent is not None and (active is None or active.info.run_id == parent):
            run_id, owned = mlflow.start_run(nested=True, parent_run_id=parent).info.run_id, True
        elif active is not None:
            run_id, owned = active.info.run_id, False
        else:
            run_id, owned = mlflow.start_run().info.run_id, True
        master = model.training_master
        turn_on = self.log_training_stats and not master.collect_training_stats
        self._fits[id(model)] = _Fit(run_id, owned, parent is not None, turn_on)
        _log_new_params(run_id, fit_params(model, epochs))
        if turn_on:
            master.collect_training_stats = True

    def epoch_ended(self, model: Any, epoch: int, metrics: Mapping[str, float]) -> None:
        """Log the epoch's metrics with the epoch as their step."""
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        fit = self._fits.get(id(model))
        if fit is None or not metrics:
            return
        now = int(time.time() * 1000)
        batch = [Metric(name, float(v), now, int(epoch)) for name, v in metrics.items() if math.isfinite(v)]
        MlflowClient().log_batch(fit.run_id, metrics=batch)

    def fit_ended(self, model: Any, stats: SparkTrainingStats | None, error: BaseException | None) -> None:
        """Log the stats report and the model; end the run this logger started."""
        fit = self._fits.pop(id(model), None)
        if fit is None:
            return
        mlflow = require_mlflow()
        try:
            if fit.stats_turned_on:
                model.training_master.collect_training_stats = False
            if error is None:
                if stats is not None and self.log_training_stats:
                    _log_stats(fit.run_id, stats)
                if self.log_models and not fit.nested:
                    log_model(
                        model.network,
                        MODEL_NAME,
                        registered_model_name=self.registered_model_name,
                        run_id=fit.run_id,
                    )
        finally:
            if fit.owned:
                status = "FINISHED" if error is None else ("KILLED" if _interrupted(error) else "FAILED")
                active = mlflow.active_run()
                if active is not None and active.info.run_id == fit.run_id:
                    mlflow.end_run(status)
                else:  # the fit's thread lost track of it (another run started meanwhile)
                    mlflow.tracking.MlflowClient().set_terminated(fit.run_id, status)


def _interrupted(error: BaseException) -> bool:
    return isinstance(error, KeyboardInterrupt)


def _log_new_params(run_id: str, params: dict[str, str]) -> None:
    """Log the params the run does not have yet; a value that changed since (a later fit in the same
    run) is kept as first logged, with a warning, since MLflow params cannot change."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    logged = client.get_run(run_id).data.params
    changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
    if changed:
        _log.warning(
            "run %s already has params %s with other values (an earlier fit); they keep those values",
            run_id,
            ", ".join(changed),
        )
    new = [Param(k, v) for k, v in params.items() if k not in logged]
    for start in range(0, len(new), _BATCH):
        client.log_batch(run_id, params=new[start : start + _BATCH])


def _log_stats(run_id: str, stats: SparkTrainingStats) -> None:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="sparkgrad-mlflow-") as tmp:
        path = os.path.join(tmp, STATS_ARTIFACT)
        stats.export_html(path)
        MlflowClient().log_artifact(run_id, path)


# -- tuning (CrossValidator, TrainValidationSplit) ---------------------------------------------------------
def _uses_sparkgrad(estimator: Any) -> bool:
    """Whether ``estimator`` is a sparkgrad.ml estimator or a Pipeline with one among its stages."""
    from sparkgrad.ml._params import SparkgradParams

    if isinstance(estimator, SparkgradParams):
        return True
    stages = estimator.getStages() if hasattr(estimator, "getStages") else []
    return any(_uses_sparkgrad(stage) for stage in stages)


def _param_name(param: Any) -> str:
    """``Stage.param`` for a Spark ML param (the stage's class from its uid ``Class_hex``)."""
    return f"{str(param.parent).rsplit('_', 1)[0]}.{param.name}"


def _sparkgrad_stage(model: Any) -> Any:
    """The fitted sparkgrad.ml model in ``model`` (itself or a stage of a PipelineModel), or None."""
    for stage in getattr(model, "stages", [model]):
        try:
            network_of(stage)
            return stage
        except (TypeError, ValueError):
            continue
    return None


def _log_tuning(tuner: Any, model: Any, run_id: str, logger: MlflowLogger) -> None:
    """The tuning run's params (the search and the best param map), the best metric, the search results
    as a CSV artifact and the best model."""
    from mlflow.tracking import MlflowClient

    evaluator = tuner.getEvaluator()
    maps = tuner.getEstimatorParamMaps()
    metrics = list(getattr(model, "avgMetrics", None) or model.validationMetrics)
    pick = max if evaluator.isLargerBetter() else min
    best = metrics.index(pick(metrics))
    metric_name = evaluator.getMetricName() if hasattr(evaluator, "getMetricName") else "metric"
    params = {
        "tuner": type(tuner).__name__,
        "estimator": type(tuner.getEstimator()).__name__,
        "evaluator": type(evaluator).__name__,
        "evaluator.metricName": metric_name,
        "num_param_maps": str(len(maps)),
    }
    for name in ("numFolds", "trainRatio", "parallelism", "seed"):
        if tuner.hasParam(name) and tuner.isDefined(name):
            params[name] = str(tuner.getOrDefault(name))
    params.update({f"best.{_param_name(p)}": str(v) for p, v in maps[best].items()})
    _log_new_params(run_id, params)
    client = MlflowClient()
    client.log_metric(run_id, f"best_{metric_name}", float(metrics[best]))
    names = sorted({_param_name(p) for m in maps for p in m})
    stds = list(getattr(model, "stdMetrics", None) or [])
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow([*names, metric_name, *([f"std_{metric_name}"] if stds else [])])
    for i, m in enumerate(maps):
        values = {_param_name(p): v for p, v in m.items()}
        writer.writerow([values.get(n, "") for n in names] + [metrics[i]] + ([stds[i]] if stds else []))
    client.log_text(run_id, text.getvalue(), SEARCH_RESULTS_ARTIFACT)
    stage = _sparkgrad_stage(model.bestModel)
    if logger.log_models and stage is not None:
        log_model(stage, MODEL_NAME, registered_model_name=logger.registered_model_name, run_id=run_id)


def _tuning_fit(original: Any) -> Any:
    """``_fit`` of a tuning estimator, run under its own MLflow run while autolog is on and the tuned
    estimator uses sparkgrad."""

    @functools.wraps(original)
    def fit(self: Any, dataset: Any) -> Any:
        logger = _autolog
        if logger is None or not _uses_sparkgrad(self.getEstimator()):
            return original(self, dataset)
        mlflow = require_mlflow()
        run = mlflow.start_run(nested=mlflow.active_run() is not None)
        with _lock:
            _tuning_runs.append(run.info.run_id)
        status = "FAILED"
        try:
            model = original(self, dataset)
            _log_tuning(self, model, run.info.run_id, logger)
            status = "FINISHED"
            return model
        finally:
            with _lock:
                _tuning_runs.remove(run.info.run_id)
            mlflow.end_run(status)

    fit.__sparkgrad_original__ = original  # type: ignore[attr-defined]
    return fit


def _patch_tuning(enable: bool) -> None:
    """Wrap (or unwrap) ``CrossValidator._fit`` and ``TrainValidationSplit._fit``; nothing without
    pyspark."""
    try:
        from pyspark.ml.tuning import CrossValidator, TrainValidationSplit
    except ImportError:
        return
    for cls in (CrossValidator, TrainValidationSplit):
        key = (cls, "_fit")
        if enable and key not in _patched:
            _patched[key] = cls.__dict__["_fit"]
            cls._fit = _tuning_fit(_patched[key])  # type: ignore[method-assign]
        elif not enable and key in _patched:
            cls._fit = _patched.pop(key)  # type: ignore[method-assign]


def autolog(
    log_models: bool = True,
    log_training_stats: bool = True,
    registered_model_name: str | None = None,
    disable: bool = False,
) -> None:
    """Log every ``SparkMultiLayer`` / ``SparkComputationGraph`` / ``sparkgrad.ml`` fit of this process to
    MLflow, as :class:`MlflowLogger` says, and autologged ``CrossValidator`` / ``TrainValidationSplit``
    fits of sparkgrad estimators as one run with a nested run per fit. Calling it again replaces the
    settings.

    Args:
        log_models: log the trained network at the end of every fit (of a tuning fit: its best model).
        log_training_stats: collect the training stats of every fit and log their HTML report.
        registered_model_name: register every logged model as a new version of this registered model.
        disable: turn autologging off.

    Raises:
        EnvironmentNotReadyError: MLflow is not installed (``pip install "sparkgrad[mlflow]"``).
    """
    global _autolog
    require_mlflow()
    with _lock:
        if _autolog is not None:
            remove_fit_listener(_autolog)
            _autolog = None
        if not disable:
            _autolog = MlflowLogger(log_models, log_training_stats, registered_model_name)
            add_fit_listener(_autolog)
    _patch_tuning(not disable)

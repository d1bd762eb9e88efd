"""The ``sparkgrad`` MLflow model flavor and its ``python_function`` (pyfunc) form.

A saved model directory holds MLflow's ``MLmodel`` file, the environment files (``requirements.txt``,
``python_env.yaml``, ``conda.yaml``) and ``network.zip``, the network written by
``MultiLayerNetwork.save`` / ``ComputationGraph.save`` (format in :mod:`sparkgrad.nn.serialization`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad.errors import EnvironmentNotReadyError

if TYPE_CHECKING:
    from mlflow.models import Model, ModelSignature
    from mlflow.models.model import ModelInfo

FLAVOR_NAME = "sparkgrad"
"""The name of the MLflow model flavor (the ``flavors`` key in ``MLmodel``)."""
NETWORK_FILE = "network.zip"
INSTALL_HINT = 'pip install "sparkgrad[mlflow]"'


def require_mlflow() -> Any:
    """The ``mlflow`` module; EnvironmentNotReadyError naming the extra to install when it is missing."""
    try:
        import mlflow
    except ImportError as exc:
        raise EnvironmentNotReadyError(
            f"sparkgrad.mlflow needs MLflow, which is not installed: {INSTALL_HINT}"
        ) from exc
    return mlflow


def network_of(model: Any) -> Any:
    """The sparkgrad network of ``model``: a MultiLayerNetwork or ComputationGraph itself, the network of
    a SparkMultiLayer / SparkComputationGraph, or that of a fitted ``sparkgrad.ml`` model."""
    from sparkgrad.nn import ComputationGraph, MultiLayerNetwork

    if isinstance(model, (MultiLayerNetwork, ComputationGraph)):
        return model
    network = getattr(model, "network", None)
    if isinstance(network, (MultiLayerNetwork, ComputationGraph)):
        return network
    raise TypeError(
        "model: expected a MultiLayerNetwork, a ComputationGraph, a SparkMultiLayer / SparkComputationGraph "
        f"or a fitted sparkgrad.ml model, got {type(model).__name__}"
    )


def get_default_pip_requirements() -> list[str]:
    """The pip requirements of a saved sparkgrad model: this sparkgrad version (numpy comes with it)."""
    require_mlflow()
    from mlflow.utils.requirements_utils import _get_pinned_requirement

    return [_get_pinned_requirement("sparkgrad")]


def get_default_conda_env() -> dict[str, Any]:
    """The conda environment of a saved sparkgrad model (pip installs the default requirements)."""
    from mlflow.utils.environment import _mlflow_conda_env

    return _mlflow_conda_env(additional_pip_deps=get_default_pip_requirements())


def signature_of(network: Any) -> ModelSignature | None:
    """The signature of a network with one input and one output, from its input type.

    Input: a tensor of ``(-1, *example shape)`` in the network's dtype (pyfunc also takes it as a pandas
    DataFrame of that many numeric columns or of one array column, ``spark_udf`` as one array column).
    Output: one array of the network's outputs per example, so ``spark_udf`` returns an array column
    by default. None for a graph with several inputs or outputs, or recurrent input (no fixed example
    shape).
    """
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, Schema, TensorSpec

    from sparkgrad.spark.columns import example_shape

    try:
        shape = example_shape(network.conf)
    except ValueError:
        return None
    dtype = np.dtype(network.conf.dtype)
    return ModelSignature(
        inputs=Schema([TensorSpec(dtype, (-1, *shape))]),
        outputs=Schema([ColSpec(Array(DataType.from_numpy_type(dtype)))]),
    )


def save_model(
    network: Any,
    path: str | os.PathLike[str],
    conda_env: Any = None,
    code_paths: list[str] | None = None,
    mlflow_model: Model | None = None,
    signature: ModelSignature | bool | None = None,
    input_example: Any = None,
    pip_requirements: Any = None,
    extra_pip_requirements: Any = None,
    metadata: dict[str, Any] | None = None,
    save_updater: bool = False,
) -> None:
    """Save a sparkgrad network as an MLflow model directory with the ``sparkgrad`` and ``python_function``
    flavors.

    Args:
        network: a MultiLayerNetwork or ComputationGraph, a SparkMultiLayer / SparkComputationGraph
            (its network) or a fitted ``sparkgrad.ml`` model (its network).
        path: a local directory that does not exist yet.
        conda_env: a conda environment (dict or YAML path) replacing the default one.
        code_paths: local Python files or directories the model needs, copied next to it.
        mlflow_model: the :class:`mlflow.models.Model` this flavor is added to (new by default).
        signature: the model signature; None infers it from the network's input type
            (:func:`signature_of`); False saves none.
        input_example: an example input (a NumPy array of examples, or a pandas DataFrame), saved with
            the model.
        pip_requirements: pip requirements replacing the default ones (:func:`get_default_pip_requirements`).
        extra_pip_requirements: pip requirements added to the default ones.
        metadata: custom metadata for the ``MLmodel`` file.
        save_updater: also save the updater state (to go on training the loaded network); serving does
            not need it.
    """
    require_mlflow()
    from mlflow import pyfunc
    from mlflow.models import Model
    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.models.utils import _save_example
    from mlflow.utils.environment import (
        _CONDA_ENV_FILE_NAME,
        _CONSTRAINTS_FILE_NAME,
        _PYTHON_ENV_FILE_NAME,
        _REQUIREMENTS_FILE_NAME,
        _process_conda_env,
        _process_pip_requirements,
        _PythonEnv,
        _validate_env_arguments,
    )
    from mlflow.utils.file_utils import write_to
    from mlflow.utils.model_utils import _validate_and_copy_code_paths, _validate_and_prepare_target_save_path

    import sparkgrad

    network = network_of(network)
    _validate_env_arguments(conda_env, pip_requirements, extra_pip_requirements)
    path = os.path.abspath(os.fspath(path))
    _validate_and_prepare_target_save_path(path)
    code_dir = _validate_and_copy_code_paths(code_paths, path)
    mlflow_model = Model() if mlflow_model is None else mlflow_model
    _save_example(mlflow_model, input_example, path)
    if signature is None:
        signature = signature_of(network)
    if signature:
        mlflow_model.signature = signature
    if metadata is not None:
        mlflow_model.metadata = metadata

    network.save(os.path.join(path, NETWORK_FILE), save_updater=save_updater)
    pyfunc.add_to_model(
        mlflow_model,
        loader_module="sparkgrad.mlflow",
        data=NETWORK_FILE,
        conda_env=_CONDA_ENV_FILE_NAME,
        python_env=_PYTHON_ENV_FILE_NAME,
        code=code_dir,
    )
    mlflow_model.add_flavor(
        FLAVOR_NAME,
        sparkgrad_version=sparkgrad.__version__,
        network_type=type(network).__name__,
        data=NETWORK_FILE,
        code=code_dir,
    )
    mlflow_model.save(os.path.join(path, MLMODEL_FILE_NAME))

    if conda_env is None:
        # the default requirements, not MLflow's inference (which loads the model in a subprocess)
        defaults = get_default_pip_requirements() if pip_requirements is None else None
        conda_env, pip_requirements, constraints = _process_pip_requirements(
            defaults, pip_requirements, extra_pip_requirements
        )
    else:
        conda_env, pip_requirements, constraints = _process_conda_env(conda_env)
    import yaml

    with open(os.path.join(path, _CONDA_ENV_FILE_NAME), "w") as f:
        yaml.safe_dump(conda_env, stream=f, default_flow_style=False)
    if constraints:
        write_to(os.path.join(path, _CONSTRAINTS_FILE_NAME), "\n".join(constraints))
    write_to(os.path.join(path, _REQUIREMENTS_FILE_NAME), "\n".join(pip_requirements))
    _PythonEnv.current().to_yaml(os.path.join(path, _PYTHON_ENV_FILE_NAME))


def log_model(
    network: Any,
    name: str = "model",
    registered_model_name: str | None = None,
    signature: ModelSignature | bool | None = None,
    input_example: Any = None,
    run_id: str | None = None,
    **kwargs: Any,
) -> ModelInfo:
    """Log a sparkgrad network as an MLflow model of the active run (or of ``run_id``), optionally
    registering it in the model registry.

    Args:
        network: what :func:`save_model` takes.
        name: the model's name in the run.
        registered_model_name: when given, a new version of this registered model (created if needed).
        signature: as for :func:`save_model` (None: from the network's input type).
        input_example: as for :func:`save_model`.
        run_id: the run to log to (default: the active run, started if there is none).
        **kwargs: further arguments of :func:`save_model` (``pip_requirements``, ``save_updater``, ...)
            and of :meth:`mlflow.models.Model.log` (``await_registration_for``, ``tags``, ...).

    Returns:
        MLflow's ``ModelInfo`` (``model_uri`` loads the model back).
    """
    require_mlflow()
    import sys

    from mlflow.models import Model

    return Model.log(
        artifact_path=None,
        name=name,
        flavor=sys.modules["sparkgrad.mlflow"],
        registered_model_name=registered_model_name,
        network=network_of(network),
        signature=signature,
        input_example=input_example,
        run_id=run_id,
        **kwargs,
    )


def load_model(model_uri: str, dst_path: str | None = None, device: Any = "cpu") -> Any:
    """Load a network logged or saved with the ``sparkgrad`` flavor.

    Args:
        model_uri: any MLflow model URI: a local path, ``runs:/<run id>/<name>``, ``models:/<id>``,
            ``models:/<registered name>/<version>``, a remote artifact location.
        dst_path: a local directory to download the model into (default: a temporary one).
        device: the device of the loaded network (``"cpu"`` or ``"cuda:N"``).

    Returns:
        The MultiLayerNetwork or ComputationGraph, with the saved parameters and counters.
    """
    require_mlflow()
    from mlflow.tracking.artifact_utils import _download_artifact_from_uri
    from mlflow.utils.model_utils import _get_flavor_configuration

    local = _download_artifact_from_uri(artifact_uri=model_uri, output_path=dst_path)
    conf = _get_flavor_configuration(model_path=local, flavor_name=FLAVOR_NAME)
    return _load_network(os.path.join(local, conf["data"]), conf["network_type"], device)


def _load_network(file: str, network_type: str, device: Any = "cpu") -> Any:
    from sparkgrad.spark.common import network_classes

    network_cls, _ = network_classes(network_type)
    return network_cls.load(file, device=device)


class SparkgradPyfuncModel:
    """The ``python_function`` form of a sparkgrad network: ``predict`` returns the network's output.

    Input: a NumPy array of examples; a pandas DataFrame of numeric columns (one per feature value) or of
    one column holding an array per example (what ``spark_udf`` passes for an array column); a dict with
    one array. Examples are reshaped to the network's input shape (images as ``channels * height * width``
    values) and cast to its dtype.
    """

    def __init__(self, network: Any) -> None:
        self.network = network

    def get_raw_model(self) -> Any:
        """The network."""
        return self.network

    def predict(self, data: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """The network's output for ``data``.

        Args:
            data: the examples (see the class docstring).
            params: unused (no inference parameters).

        Returns:
            A ``(examples, outputs)`` array in the network's dtype.
        """
        from sparkgrad.spark.columns import example_shape, network_output

        x = _examples(data)
        try:
            shape = example_shape(self.network.conf)
        except ValueError:  # recurrent input: the array goes in as given
            shape = None
        x = np.asarray(x, dtype=self.network.conf.dtype)
        if shape is not None:
            x = x.reshape(-1, *shape)
        return np.asarray(network_output(self.network, x))


def _examples(data: Any) -> np.ndarray:
    """``data`` as one array of examples (see :class:`SparkgradPyfuncModel`)."""
    import pandas as pd

    if isinstance(data, dict):
        if len(data) != 1:
            raise ValueError(f"data: a dict input needs exactly one array, got keys {sorted(data)}")
        data = next(iter(data.values()))
    if isinstance(data, pd.Series):
        data = data.to_frame()
    if isinstance(data, pd.DataFrame):
        if data.shape[1] == 1 and data.dtypes.iloc[0] == np.dtype(object):  # one array per example
            column = data.iloc[:, 0]
            values = [v.toArray() if hasattr(v, "toArray") else v for v in column]
            return np.stack([np.asarray(v) for v in values]) if values else np.empty((0,))
        return data.to_numpy()
    return np.asarray(data)


def _load_pyfunc(path: str) -> SparkgradPyfuncModel:
    """MLflow's entry point for the ``python_function`` flavor: ``path`` is the flavor's data file."""
    from mlflow.models import Model
    from mlflow.models.model import MLMODEL_FILE_NAME

    directory = os.path.dirname(path)
    conf = Model.load(os.path.join(directory, MLMODEL_FILE_NAME)).flavors[FLAVOR_NAME]
    return SparkgradPyfuncModel(_load_network(path, conf["network_type"]))

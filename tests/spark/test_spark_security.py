"""A fit on a Spark that authenticates, encrypts its network (RPC SSL with a keystore the test makes, and
AES network crypto) and its local-disk I/O: the cluster job of docs/guides/cluster.md under spark-submit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import spark_submit, submit_output

from sparkgrad.nn import MultiLayerNetwork

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parent / "jobs" / "train_digits.py"


def _keytool() -> str | None:
    home = os.environ.get("JAVA_HOME")
    here = Path(home, "bin", "keytool") if home else None
    return str(here) if here is not None and here.exists() else shutil.which("keytool")


def test_a_fit_runs_with_authentication_and_encryption_on(tmp_path) -> None:
    submit, env = spark_submit()
    keytool = _keytool()
    if keytool is None:
        pytest.skip("the JDK's keytool is needed to make the keystore")
    store, password = tmp_path / "keystore.p12", "sparkgrad-test"
    subprocess.run(
        [keytool, "-genkeypair", "-alias", "spark", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2"]
        + ["-dname", "CN=localhost", "-keystore", str(store), "-storetype", "PKCS12"]
        + ["-storepass", password, "-keypass", password],
        check=True,
        capture_output=True,
    )
    conf = {
        "spark.authenticate": "true",
        "spark.network.crypto.enabled": "true",
        "spark.io.encryption.enabled": "true",  # Spark's spills, and sparkgrad's stored partitions
        "spark.ssl.enabled": "true",
        "spark.ssl.rpc.enabled": "true",
        "spark.ssl.protocol": "TLSv1.3",
        "spark.ssl.keyStore": str(store),
        "spark.ssl.keyStoreType": "PKCS12",
        "spark.ssl.keyStorePassword": password,
        "spark.ssl.keyPassword": password,
        "spark.ssl.trustStore": str(store),
        "spark.ssl.trustStoreType": "PKCS12",
        "spark.ssl.trustStorePassword": password,
        "spark.local.dir": str(tmp_path),
    }
    options = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    model = tmp_path / "digits-mlp.zip"
    command = [*submit, *options, str(JOB), model.as_uri(), "1"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, submit_output(result)
    # the settings took effect: Spark's SecurityManager says so at start
    assert "authentication enabled" in result.stderr and "RPC SSL enabled" in result.stderr
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("test accuracy")]
    assert len(line) == 1 and float(line[0].split()[2].rstrip(";")) > 0.5  # 0.80 after one epoch; chance 0.1
    net = MultiLayerNetwork.load(model)
    assert net.epoch_count == 1 and np.isfinite(net.params()).all()

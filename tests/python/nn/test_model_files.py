"""Model files (sparkgrad.nn.serialization): version 2 round trips, version 1 files, and every way a
damaged or crafted zip is rejected with CorruptDataError naming the file and the member."""

from __future__ import annotations

import io
import json
import re
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sparkgrad.data import DataSet
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn import (
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)

META, CONF, COEFF, STATE = (
    "sparkgrad-format.json",
    "configuration.json",
    "coefficients.bin",
    "updaterState.bin",
)


def trained(updater: object = None, dtype: str = "float32") -> MultiLayerNetwork:
    """A small network after two Adam steps: non-trivial parameters, state and counters."""
    conf = MultiLayerConfiguration(
        [DenseLayer(5, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(4),
        updater=updater or updaters.Adam(0.01),
        seed=3,
        dtype=dtype,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(dtype)
    return MultiLayerNetwork(conf).init().fit(DataSet(x, np.eye(3, dtype=dtype)[np.arange(8) % 3]), epochs=2)


def saved(net: MultiLayerNetwork, save_updater: bool = True) -> bytes:
    buffer = io.BytesIO()
    net.save(buffer, save_updater=save_updater)
    return buffer.getvalue()


def members(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rezip(content: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as zf:
        for name, data in content.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def load(blob: bytes, path: Path, **kwargs: bool) -> MultiLayerNetwork:
    path.write_bytes(blob)
    return MultiLayerNetwork.load(path, **kwargs)


def assert_identical(loaded: MultiLayerNetwork, net: MultiLayerNetwork, state: bool = True) -> None:
    assert loaded.conf == net.conf
    assert loaded.params().dtype == net.params().dtype
    assert loaded.params().tobytes() == net.params().tobytes()
    expected_state = net.updater_state() if state else np.zeros_like(net.updater_state())
    assert loaded.updater_state().tobytes() == expected_state.tobytes()
    assert (loaded.iteration_count, loaded.epoch_count) == (net.iteration_count, net.epoch_count)


@pytest.fixture(scope="module")
def net() -> MultiLayerNetwork:
    return trained()


@pytest.fixture(scope="module")
def good(net: MultiLayerNetwork) -> dict[str, bytes]:
    return members(saved(net))


def test_round_trip_records_whether_the_updater_state_was_saved(
    net: MultiLayerNetwork, tmp_path: Path
) -> None:
    with_state = members(saved(net))
    assert set(with_state) == {META, CONF, COEFF, STATE}
    assert json.loads(with_state[META]) == {
        "format_version": 2,
        "model": "MultiLayerNetwork",
        "iteration_count": 2,
        "epoch_count": 2,
        "updater_state": True,
    }
    assert_identical(load(saved(net), tmp_path / "m.zip"), net)
    without = saved(net, save_updater=False)
    assert set(members(without)) == {META, CONF, COEFF}
    assert json.loads(members(without)[META])["updater_state"] is False
    assert_identical(load(without, tmp_path / "m.zip"), net, state=False)  # not saved: fresh state
    assert_identical(load(saved(net), tmp_path / "m.zip", load_updater=False), net, state=False)
    sgd = trained(updaters.Sgd(0.1), dtype="float64")
    assert set(members(saved(sgd))) == {META, CONF, COEFF}
    assert_identical(load(saved(sgd), tmp_path / "m.zip"), sgd)


def test_the_same_network_saves_to_the_same_bytes_at_any_time(
    net: MultiLayerNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = saved(net)
    # two saves a day apart (zip members carry a modification time unless the writer fixes it)
    tomorrow = time.time() + 86_400.0
    monkeypatch.setattr(time, "time", lambda: tomorrow)
    assert saved(net) == first


def version_1(net: MultiLayerNetwork, save_updater: bool = True) -> bytes:
    """A file as sparkgrad wrote it before format version 2 (independent of the current writer)."""
    meta = {
        "format_version": 1,
        "model": "MultiLayerNetwork",
        "iteration_count": net.iteration_count,
        "epoch_count": net.epoch_count,
    }
    content = {META: json.dumps(meta).encode(), CONF: net.conf.to_json().encode(), COEFF: npy(net.params())}
    if save_updater:
        content[STATE] = npy(net.updater_state())
    return rezip(content)


def test_version_1_files_still_load(net: MultiLayerNetwork, tmp_path: Path) -> None:
    assert_identical(load(version_1(net), tmp_path / "v1.zip"), net)
    assert_identical(load(version_1(net, save_updater=False), tmp_path / "v1.zip"), net, state=False)


def test_non_finite_parameters_are_not_written(tmp_path: Path) -> None:
    net = trained()
    net.params()[3] = np.nan
    with pytest.raises(ValueError, match="params: element 3 is not finite"):
        net.save(tmp_path / "nan.zip")


def _meta(**changes: object) -> bytes:
    meta = {"format_version": 2, "model": "MultiLayerNetwork", "iteration_count": 2, "epoch_count": 2}
    meta["updater_state"] = True
    meta.update(changes)
    return json.dumps({k: v for k, v in meta.items() if v is not _DROP}).encode()


_DROP = object()


def _cases(net: MultiLayerNetwork, good: dict[str, bytes]) -> dict[str, tuple[dict[str, bytes], str, str]]:
    """name -> (members, the member the message must name, a fragment of the message)."""
    params, state = net.params(), net.updater_state()
    conf64 = net.conf.to_json().replace('"dtype": "float32"', '"dtype": "float64"')
    assert MultiLayerConfiguration.from_json(conf64).dtype == "float64"
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.array([None] * params.size, dtype=object), allow_pickle=True)
    pickled = buffer.getvalue()
    other_conf = MultiLayerConfiguration(
        [DenseLayer(6), OutputLayer(3)], input_type=InputType.feed_forward(4), updater=updaters.Adam(0.01)
    )

    def with_(**replace: bytes) -> dict[str, bytes]:
        content = dict(good)
        for key, value in replace.items():
            name = {"meta": META, "conf": CONF, "coeff": COEFF, "state": STATE}[key]
            content[name] = value
        return content

    def without(name: str) -> dict[str, bytes]:
        return {k: v for k, v in good.items() if k != name}

    nan_params = params.copy()
    nan_params[4] = np.nan
    inf_state = state.copy()
    inf_state[-1] = np.inf
    return {
        "iteration -5": (with_(meta=_meta(iteration_count=-5)), META, "iteration_count"),
        "iteration 3.7": (with_(meta=_meta(iteration_count=3.7)), META, "iteration_count"),
        "iteration true": (with_(meta=_meta(iteration_count=True)), META, "iteration_count"),
        "iteration string": (with_(meta=_meta(iteration_count="2")), META, "iteration_count"),
        "iteration 2**63": (with_(meta=_meta(iteration_count=2**63)), META, "iteration_count"),
        "epoch -1": (with_(meta=_meta(epoch_count=-1)), META, "epoch_count"),
        "epoch NaN": (with_(meta=_meta().replace(b'"epoch_count": 2', b'"epoch_count": NaN')), META, "NaN"),
        "duplicate key": (with_(meta=_meta()[:-1] + b', "epoch_count": 9}'), META, "duplicate keys"),
        "unknown key": (with_(meta=_meta(extra=1)), META, "keys"),
        "missing key": (with_(meta=_meta(epoch_count=_DROP)), META, "keys"),
        "flag not bool": (with_(meta=_meta(updater_state=1)), META, "updater_state must be"),
        "version 4": (with_(meta=_meta(format_version=4)), META, "format_version 4"),
        "version string": (with_(meta=_meta(format_version="2")), META, "format_version"),
        "other model": (with_(meta=_meta(model="ComputationGraph")), META, "ComputationGraph"),
        "meta list": (with_(meta=b"[2]"), META, "JSON object"),
        "meta bad json": (with_(meta=b'{"format_version": 2'), META, "JSONDecodeError"),
        "meta deep": (with_(meta=b"[" * 30_000 + b"]" * 30_000), META, "RecursionError"),
        "meta utf8": (with_(meta=b'{"model": "\xff"}'), META, "UnicodeDecodeError"),
        "conf bad json": (with_(conf=b"{"), CONF, "not valid JSON"),
        "conf deep": (with_(conf=b"[" * 100_000 + b"]" * 100_000), CONF, ""),
        "conf list": (with_(conf=b"[]"), CONF, ""),
        "conf utf8": (with_(conf=b"\xfe\xff"), CONF, "UnicodeDecodeError"),
        "conf other architecture": (with_(conf=other_conf.to_json().encode()), COEFF, "shape"),
        "conf float64": (with_(conf=conf64.encode()), COEFF, ""),
        "coefficients NaN": (with_(coeff=npy(nan_params)), COEFF, "element 4 is not finite"),
        "coefficients float16": (with_(coeff=npy(params.astype(np.float16))), COEFF, ""),
        "coefficients float64": (with_(coeff=npy(params.astype(np.float64))), COEFF, ""),
        "coefficients int32": (with_(coeff=npy(params.view(np.int32))), COEFF, "not floating point"),
        "coefficients short": (with_(coeff=npy(params[:-1])), COEFF, ""),
        "coefficients 2-D": (with_(coeff=npy(params.reshape(1, -1))), COEFF, "shape"),
        "coefficients trailing": (with_(coeff=npy(params) + b"\0" * 4), COEFF, ""),
        "coefficients not npy": (with_(coeff=params.tobytes()), COEFF, ""),
        "coefficients pickle": (with_(coeff=pickled), COEFF, ""),
        "state NaN": (with_(state=npy(inf_state)), STATE, "not finite"),
        "state short": (with_(state=npy(state[:-2])), STATE, ""),
        "state missing": (without(STATE), META, "missing"),
        "state not declared": (with_(meta=_meta(updater_state=False)), META, "present"),
        "state renamed": (
            {**without(STATE), "updaterState.bim": good[STATE]},
            "updaterState.bim",
            "unexpected",
        ),
        "extra member": ({**good, "objects/x": b"1"}, "objects/x", "unexpected"),
        "coefficients missing": (without(COEFF), COEFF, "missing"),
    }


def _case_names() -> list[str]:
    return list(_cases(trained(), members(saved(trained()))))


@pytest.mark.parametrize("case", _case_names())
def test_crafted_members_are_rejected_naming_the_member(
    case: str, net: MultiLayerNetwork, good: dict[str, bytes], tmp_path: Path
) -> None:
    content, member, fragment = _cases(net, good)[case]
    path = tmp_path / "crafted.zip"
    with pytest.raises(CorruptDataError, match=rf"^{re.escape(str(path))}: .*{member}") as info:
        load(rezip(content), path)
    assert fragment in str(info.value)
    # load_updater=False does not skip the checks
    with pytest.raises(CorruptDataError, match=rf"^{re.escape(str(path))}: "):
        MultiLayerNetwork.load(path, load_updater=False)


def _patch_central(blob: bytes, member: str, offset: int, fmt: str, value: int) -> bytes:
    """Overwrite a field of ``member``'s central-directory record (offsets per the zip spec)."""
    start = blob.index(b"PK\x01\x02")
    while True:
        (name_len,) = struct.unpack_from("<H", blob, start + 28)
        if blob[start + 46 : start + 46 + name_len] == member.encode():
            break
        start = blob.index(b"PK\x01\x02", start + 4)
    return blob[: start + offset] + struct.pack(fmt, value) + blob[start + offset + struct.calcsize(fmt) :]


def test_zip_structure_damage_is_rejected(
    net: MultiLayerNetwork, good: dict[str, bytes], tmp_path: Path
) -> None:
    blob = saved(net)
    bomb_conf = MultiLayerConfiguration(
        [DenseLayer(100_000), OutputLayer(100_000)], input_type=InputType.feed_forward(100_000)
    ).to_json()
    cases = {
        "empty": (b"", "BadZipFile"),
        "garbage": (b"not a zip at all" * 10, "BadZipFile"),
        "truncated": (blob[: len(blob) // 2], "BadZipFile"),
        "prefix": (b"junk" + blob, "data before the first member"),
        "comment": (blob[:-2] + struct.pack("<H", 3) + b"abc", "comment"),
        "bzip2": (rezip(good, zipfile.ZIP_BZIP2), "unsupported compression method 12"),
        "encrypted": (_patch_central(blob, COEFF, 8, "<H", 0x1), "encrypted"),
        "method 99": (_patch_central(blob, COEFF, 10, "<H", 99), "compression method 99"),
        "declared size bomb": (_patch_central(blob, STATE, 24, "<I", 2**32 - 1), "more than the compression"),
        "declared compressed size": (_patch_central(blob, CONF, 20, "<I", 2**31), "beyond the end"),
        "bad CRC": (_patch_central(blob, CONF, 16, "<I", 1234), "CRC"),
        "duplicate member": (_duplicate(good), "duplicate member names"),
        "configuration claims 10**10 params": (rezip({**good, CONF: bomb_conf.encode()}), "declares"),
    }
    for name, (content, fragment) in cases.items():
        path = tmp_path / f"{name}.zip"
        path.write_bytes(content)
        with pytest.raises(CorruptDataError, match=rf"^{re.escape(str(path))}: ") as info:
            MultiLayerNetwork.load(path)
        assert fragment in str(info.value), name
    with pytest.raises(CorruptDataError, match=r"^<BytesIO>: "):
        MultiLayerNetwork.load(io.BytesIO(blob[:-1]))
    with pytest.raises(FileNotFoundError):
        MultiLayerNetwork.load(tmp_path / "missing.zip")


def _duplicate(good: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(buffer, "w") as zf:
        for name, data in good.items():
            zf.writestr(name, data)
        zf.writestr(STATE, good[STATE])
    return buffer.getvalue()

"""The shared configuration mechanism: JSON/YAML round trips, registry, validation messages."""

from __future__ import annotations

import dataclasses
import enum
import json
import math

import numpy as np
import pytest

from sparkgrad._config import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    Config,
    check_int,
    check_non_negative,
    check_number,
    check_positive,
    check_range,
    coerce_enum,
)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class _Leaf(Config):
    rate: float = 0.1
    colour: Colour = Colour.RED
    kernel: tuple = (3, 3)

    def __post_init__(self) -> None:
        self.rate = check_positive("rate", self.rate)
        self.colour = coerce_enum(Colour, self.colour, "colour")


@dataclasses.dataclass
class _NeedsRate(Config):
    rate: float

    def __post_init__(self) -> None:
        if self.rate < 0:  # a list here trips the comparison: TypeError, reported as ValueError
            raise ValueError("rate: must be >= 0")


@dataclasses.dataclass
class _Tree(Config):
    leaves: list = dataclasses.field(default_factory=list)
    main: _Leaf = dataclasses.field(default_factory=_Leaf)
    ratio: float = float("inf")


def test_round_trips_nested_configs_enums_tuples_and_infinities():
    tree = _Tree(leaves=[_Leaf(0.5, "BLUE", (1, 2)), _Leaf()], main=_Leaf(2.0))
    assert _Tree.from_json(tree.to_json()) == tree
    assert _Tree.from_yaml(tree.to_yaml()) == tree
    assert Config.from_json(tree.to_json()) == tree
    assert _Tree.from_json(tree.to_json()).leaves[0].kernel == (1, 2)


def test_enum_strings_are_case_insensitive():
    assert _Leaf(colour="Blue").colour is Colour.BLUE
    with pytest.raises(ValueError, match=r"colour: expected one of red, blue, got 'green'"):
        _Leaf(colour="green")


def test_rejects_unknown_fields_foreign_types_and_bad_values():
    with pytest.raises(ValueError, match=r"_Leaf: unknown field 'speed'"):
        _Leaf.from_dict({"@type": "_Leaf", "speed": 1})
    with pytest.raises(ValueError, match=r"expected a _Leaf configuration, got '_Tree'"):
        _Leaf.from_json(_Tree().to_json())
    with pytest.raises(ValueError, match=r"unknown configuration type 'Nope'"):
        Config.from_dict({"@type": "Nope"})
    with pytest.raises(ValueError, match=r"rate: must be > 0, got -1"):
        _Leaf.from_dict({"@type": "_Leaf", "rate": -1})
    with pytest.raises(ValueError, match="not valid JSON"):
        _Leaf.from_json("{")


# -- untrusted text: aliases, depth, hostile input -------------------------------------------------


def _alias_bomb(levels: int = 9) -> str:
    """The classic "billion laughs": each level repeats the previous one 9 times (9**levels strings)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_before_expansion():
    bomb = _alias_bomb()
    assert len(bomb) < 600
    with pytest.raises(ValueError, match=r"_Leaf\.from_yaml: anchors are not allowed \(line 1\)"):
        _Leaf.from_yaml(bomb)


def test_yaml_aliases_and_anchors_are_refused_naming_the_line():
    with pytest.raises(ValueError, match=r"aliases are not allowed \(line 3\)"):
        _Tree.from_yaml("'@type': _Tree\nratio: 1.0\nmain: *x\n")
    with pytest.raises(ValueError, match=r"anchors are not allowed \(line 2\)"):
        _Tree.from_yaml("'@type': _Tree\nmain: &m {'@type': _Leaf}\n")


def test_yaml_output_has_no_anchors_even_for_shared_objects():
    shared = _Leaf(0.5)
    tree = _Tree(leaves=[shared, shared], main=shared)
    text = tree.to_yaml()
    assert "&" not in text and "*" not in text
    assert _Tree.from_yaml(text) == tree


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_deep_nesting_is_refused_naming_the_limit(fmt):
    deep = "[" * 100_000 + "]" * 100_000  # json's scanner would raise RecursionError
    load = _Tree.from_json if fmt == "json" else _Tree.from_yaml
    with pytest.raises(ValueError, match=rf"nesting deeper than {MAX_DEPTH} levels"):
        load(deep)
    with pytest.raises(ValueError, match=rf"nesting deeper than {MAX_DEPTH} levels"):
        load('{"x": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1))


def test_configuration_text_size_limit_fits_real_configurations():
    """A 1,000-layer network (an updater per layer) is a tenth of the limit; longer text is refused
    before it is scanned, in JSON and YAML alike."""
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam

    layers = [DenseLayer(8, activation="relu", updater=Adam(1e-3)) for _ in range(1000)]
    conf = MultiLayerConfiguration(
        [*layers, OutputLayer(3, activation="softmax", loss="mcxent")], input_type=InputType.feed_forward(8)
    )
    text = conf.to_json()
    assert len(text) < MAX_CONFIG_BYTES / 8
    assert MultiLayerConfiguration.from_json(text) == conf
    padded = text + " " * (MAX_CONFIG_BYTES - len(text) + 1)
    for load in (MultiLayerConfiguration.from_json, MultiLayerConfiguration.from_yaml):
        with pytest.raises(ValueError, match=f"{MAX_CONFIG_BYTES + 1} bytes of configuration text exceed"):
            load(padded)


def test_nesting_at_the_limit_and_brackets_in_strings_are_accepted():
    # MAX_DEPTH - 2 lists inside the _Tree mapping and its "leaves" list
    nested = "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)
    text = (
        '{"@type": "_Tree", "leaves": ['
        + nested
        + '], "main": {"@type": "_Leaf", "kernel": {"@tuple": ["[[[", 1]}}}'
    )
    tree = _Tree.from_json(text)
    assert tree.main.kernel == ("[[[", 1)
    assert _Tree.from_yaml(text) == tree  # JSON is YAML
    with pytest.raises(ValueError, match="nesting deeper"):
        _Tree.from_json(text.replace(nested, "[" + nested + "]"))


def test_deep_dicts_are_refused_by_from_dict():
    data: dict = {"@type": "_Tree"}
    inner = data
    for _ in range(MAX_DEPTH + 5):
        inner["ratio"] = {"v": {}}
        inner = inner["ratio"]["v"]
    with pytest.raises(ValueError, match=rf"nesting deeper than {MAX_DEPTH} levels"):
        _Tree.from_dict(data)


def test_malformed_structure_raises_value_error_naming_the_problem():
    with pytest.raises(ValueError, match=r"_NeedsRate: missing field 'rate'"):
        _NeedsRate.from_dict({"@type": "_NeedsRate"})
    with pytest.raises(ValueError, match=r"_NeedsRate: '<' not supported"):
        _NeedsRate.from_dict({"@type": "_NeedsRate", "rate": [1]})
    with pytest.raises(ValueError, match=r"unknown configuration type \['x'\]"):
        Config.from_dict({"@type": ["x"]})
    with pytest.raises(ValueError, match=r"'@tuple' must hold a list"):
        _Leaf.from_dict({"@type": "_Leaf", "kernel": {"@tuple": 3}})
    with pytest.raises(ValueError, match="not valid JSON"):
        _Leaf.from_json(b"\xff\xfe")
    with pytest.raises(ValueError, match="not valid YAML"):
        _Leaf.from_yaml("a: [1, 2")


# -- numeric helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [math.inf, -math.inf, math.nan, 10**400, np.float32("inf"), np.float64("nan")]
)
def test_numeric_helpers_reject_non_finite_values_naming_the_field(bad):
    for check in (check_number, check_positive, check_non_negative):
        with pytest.raises(ValueError, match=r"^speed: expected a finite number"):
            check("speed", bad)
    with pytest.raises(ValueError, match=r"^speed: expected a finite number"):
        check_range("speed", bad, -1e308, 1e308)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), "1.0", None, [1.0], 1 + 0j])
def test_numeric_helpers_reject_bools_and_non_numbers(bad):
    with pytest.raises(ValueError, match=r"^speed: expected a number"):
        check_number("speed", bad)
    with pytest.raises(ValueError, match=r"^speed: expected an integer"):
        check_int("speed", bad)


def test_numeric_helpers_accept_numpy_scalars_and_apply_bounds():
    assert check_number("x", np.float32(0.5)) == 0.5
    assert check_positive("x", np.int64(3), maximum=3) == 3.0
    assert check_non_negative("x", 0) == 0.0
    with pytest.raises(ValueError, match=r"^x: must be in \(0, 1e\+06\], got 2000000.0"):
        check_positive("x", 2e6, maximum=1e6)
    with pytest.raises(ValueError, match=r"^x: must be in \[0, 1\], got -0.5"):
        check_non_negative("x", -0.5, maximum=1)
    with pytest.raises(ValueError, match=r"^x: must be > 0, got 0"):
        check_positive("x", 0)


# -- every float field of every configuration --------------------------------------------------------

# Smallest valid arguments of the classes that have required fields.
_REQUIRED = {
    "FixedThresholdAlgorithm": {"threshold": 0.5},
    "DenseLayer": {"n_out": 2},
    "OutputLayer": {"n_out": 2},
    "ConvolutionLayer": {"n_out": 2},
    "DropoutLayer": {"dropout": 0.5},
    "ActivationLayer": {"activation": "relu"},
    "LSTM": {"n_out": 2},
    "GRU": {"n_out": 2},
    "Convolution1DLayer": {"n_out": 2},
    "Deconvolution2D": {"n_out": 2},
    "SimpleRnn": {"n_out": 2},
    "RnnOutputLayer": {"n_out": 2},
    "EmbeddingLayer": {"n_in": 5, "n_out": 2},
    "EmbeddingSequenceLayer": {"n_in": 5, "n_out": 2},
    "SelfAttentionLayer": {"n_out": 2},
    "LearnedSelfAttentionLayer": {"n_out": 2, "n_queries": 1},
    "PositionEmbeddingLayer": {"sequence_length": 4},
}
_CONFIG_MODULES = (
    "sparkgrad.compress.thresholds",
    "sparkgrad.nn.conf",
    "sparkgrad.nn.layers",
    "sparkgrad.nn.updaters",
)


def _float_fields() -> list[tuple[type, str]]:
    import sparkgrad.compress
    import sparkgrad.nn  # noqa: F401 - registers the nn configs

    found = []
    for cls in Config._registry.values():
        if cls.__module__ not in _CONFIG_MODULES or not dataclasses.is_dataclass(cls):
            continue
        if getattr(cls, "__abstractmethods__", None):
            continue
        for f in dataclasses.fields(cls):
            if f.init and "float" in str(f.type):
                found.append((cls, f.name))
    return found


def _build(cls: type, **overrides):
    from sparkgrad.nn import OutputLayer

    kwargs = dict(_REQUIRED.get(cls.__name__, {}))
    if cls.__name__ == "MultiLayerConfiguration":
        kwargs["layers"] = [OutputLayer(2, n_in=2)]
    kwargs.update(overrides)
    return cls(**kwargs)


_FLOAT_FIELDS = _float_fields()


def test_the_float_field_table_covers_every_config_family():
    names = {(cls.__name__, field) for cls, field in _FLOAT_FIELDS}
    for expected in [
        ("FixedThresholdAlgorithm", "threshold"),
        ("AdaptiveThresholdAlgorithm", "max_target_sparsity"),
        ("TargetSparsityThresholdAlgorithm", "last_threshold"),
        ("ResidualClippingPostProcessor", "threshold_multiple_clip_value"),
        ("Adam", "epsilon"),
        ("Nesterovs", "momentum"),
        ("AdaDelta", "rho"),
        ("DenseLayer", "dropout"),
        ("OutputLayer", "l1"),
        ("BatchNormalization", "eps"),
        ("MultiLayerConfiguration", "weight_decay"),
        ("MultiLayerConfiguration", "gradient_normalization_threshold"),
        ("LSTM", "gradient_normalization_threshold"),
    ]:
        assert expected in names
    assert len(names) >= 40


def _assert_nan_means_not_set(cls: type, field: str) -> None:
    """A threshold algorithm's state field takes nan as "not set yet": kept, written to JSON as "nan" and
    read back, and the algorithm acts as if it had no such state."""
    algorithm = _build(cls, **{field: math.nan})
    assert math.isnan(getattr(algorithm, field))
    data = algorithm.to_dict()
    assert data[field] == "nan"
    assert math.isnan(getattr(cls.from_json(json.dumps(data)), field))
    zeros = np.zeros(8, np.float32)
    if field == "last_threshold":
        # no threshold yet: the first step starts at initial_threshold (a stored one would rise from
        # itself after a dense message)
        assert algorithm.calculate_threshold(0, 0, None, True, None, zeros) == algorithm.initial_threshold
        assert algorithm.last_threshold == algorithm.initial_threshold
        stored = _build(cls, last_threshold=1e-3)
        assert stored.calculate_threshold(0, 0, None, True, None, zeros) > 1e-3
    else:
        # a stored threshold but no sparsity: with none passed in, there is nothing to adapt from
        algorithm = _build(cls, last_threshold=1e-3, last_sparsity=math.nan)
        with pytest.raises(ValueError, match="no previous sparsity"):
            algorithm.calculate_threshold(0, 0, None, False, None, zeros)
        stored = _build(cls, last_threshold=1e-3, last_sparsity=1.0)
        assert stored.calculate_threshold(0, 0, None, False, None, zeros) > 1e-3  # denser than any target


@pytest.mark.parametrize(("cls", "field"), _FLOAT_FIELDS, ids=[f"{c.__name__}.{f}" for c, f in _FLOAT_FIELDS])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e300, -1.0])
def test_every_float_field_rejects_non_finite_and_out_of_range_values(cls, field, bad):
    default = {f.name: f.default for f in dataclasses.fields(cls)}[field]
    if isinstance(default, float) and math.isnan(default) and math.isnan(bad):
        _assert_nan_means_not_set(cls, field)  # state fields (last_threshold, last_sparsity)
        return
    with pytest.raises(ValueError, match=rf"(^|\W){field}: "):
        _build(cls, **{field: bad})
    # the same value read from JSON ("inf"/"nan" are how non-finite floats are written)
    data = _build(cls).to_dict()
    data[field] = repr(bad) if not math.isfinite(bad) else bad
    with pytest.raises(ValueError, match=rf"(^|\W){field}: "):
        cls.from_json(json.dumps(data))


def test_threshold_bounds_follow_the_float32_header():
    from sparkgrad.compress import (
        MAX_THRESHOLD,
        MIN_THRESHOLD,
        AdaptiveThresholdAlgorithm,
        FixedThresholdAlgorithm,
        ResidualClippingPostProcessor,
    )

    # the bounds survive the float32 header: no rounding to 0 or inf
    assert np.float32(MIN_THRESHOLD) > 0 and np.isfinite(np.float32(MAX_THRESHOLD))
    assert FixedThresholdAlgorithm(MIN_THRESHOLD).threshold == MIN_THRESHOLD
    assert FixedThresholdAlgorithm(MAX_THRESHOLD).threshold == MAX_THRESHOLD
    with pytest.raises(ValueError, match=r"^threshold: must be in \[1.17549e-38, 1e\+06\], got 1e-40"):
        FixedThresholdAlgorithm(1e-40)  # a subnormal float32 in the header
    with pytest.raises(ValueError, match=r"^initial_threshold: must be in"):
        AdaptiveThresholdAlgorithm(initial_threshold=3.4e38)
    with pytest.raises(ValueError, match=r"^max_target_sparsity: must be in \(0, 1\]"):
        AdaptiveThresholdAlgorithm(max_target_sparsity=1.5)
    # the clip limit, threshold * multiple, stays finite in float32 at both bounds
    assert np.isfinite(
        np.float32(MAX_THRESHOLD * ResidualClippingPostProcessor(1e6).threshold_multiple_clip_value)
    )


def test_parameter_averaging_options_are_validated_naming_the_field():
    from sparkgrad.spark import ParameterAveragingTrainingMaster

    for field, bad in [
        ("batch_size_per_worker", 0),
        ("averaging_frequency", 1.5),
        ("aggregation_depth", True),
        ("num_workers", 0),
        ("rng_seed", -1),
        ("export_directory", ""),
        ("export_directory", 3),
        ("save_updater", "yes"),
    ]:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            ParameterAveragingTrainingMaster(**{field: bad})
    master = ParameterAveragingTrainingMaster(export_directory="hdfs:///tmp/x", rng_seed=4)
    assert ParameterAveragingTrainingMaster.from_yaml(master.to_yaml()) == master


def test_damaged_config_text_raises_only_value_error(fuzz_examples):
    """Any edit of valid JSON/YAML config text gives a valid config or a ValueError, never another error."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sparkgrad.compress import AdaptiveThresholdAlgorithm
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer, updaters

    conf = MultiLayerConfiguration(
        [DenseLayer(4, dropout=0.5, l2=1e-3), OutputLayer(3)],
        input_type=InputType.feed_forward(5),
        updater=updaters.Adam(1e-3),
    )
    texts = [
        (MultiLayerConfiguration.from_json, conf.to_json(indent=None)),
        (Config.from_yaml, AdaptiveThresholdAlgorithm(last_threshold=1e-3).to_yaml()),
    ]
    pieces = [
        '"',
        "[",
        "]",
        "{",
        "}",
        ":",
        ",",
        "&a",
        "*a",
        "inf",
        "nan",
        "-1",
        "1e300",
        "null",
        "true",
        "\n",
    ]

    @given(
        st.sampled_from(texts),
        st.integers(0, 10_000),
        st.integers(0, 3),
        st.one_of(st.sampled_from(pieces), st.text(max_size=3)),
    )
    def inner(target, position, cut, insert):
        load, text = target
        i = position % (len(text) + 1)
        damaged = text[:i] + insert + text[i + cut :]
        try:
            assert isinstance(load(damaged), Config)
        except ValueError:
            pass

    settings(max_examples=fuzz_examples, deadline=None)(inner)()

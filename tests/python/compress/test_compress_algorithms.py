"""Threshold algorithms, their reducers and residual post-processors (dl4j-reference.md sections 2, 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgrad.compress import (
    CATCH_UP_SPARSITY,
    DEFAULT_DECAY_RATE,
    DEFAULT_INITIAL_THRESHOLD,
    DEFAULT_SPARSITY_TARGET,
    DEFAULT_UPDATE_COMBINATION,
    SUMMED_UPDATERS,
    AdaptiveThresholdAlgorithm,
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
    TargetSparsityThresholdAlgorithm,
    default_threshold_algorithm,
    update_combination_for,
    update_scale,
)
from sparkgrad.compress.thresholds import MIN_THRESHOLD
from sparkgrad.nn import updaters

DECAY = 0.5 ** (1 / 20)
UPD = np.zeros(4, dtype=np.float32)


def test_default_decay_rate_halves_in_20_steps() -> None:
    assert DEFAULT_DECAY_RATE == pytest.approx(0.9659363289248456, abs=1e-15)
    assert AdaptiveThresholdAlgorithm().decay_rate == DEFAULT_DECAY_RATE


def test_adaptive_rule_step_by_step() -> None:
    a = AdaptiveThresholdAlgorithm(initial_threshold=1e-3, min_target_sparsity=1e-3, max_target_sparsity=1e-2)
    assert a.calculate_threshold(0, 0, None, None, None, UPD) == 1e-3  # first call: initial, stored
    assert a.last_threshold == 1e-3 and math.isnan(a.last_sparsity)
    # in range: returns the argument, stored threshold untouched
    assert a.calculate_threshold(1, 0, 2e-3, False, 5e-3, UPD) == 2e-3
    assert a.last_threshold == 1e-3 and a.last_sparsity == 5e-3
    # too sparse: decay
    assert a.calculate_threshold(2, 0, 2e-3, False, 1e-4, UPD) == pytest.approx(2e-3 * DECAY)
    assert a.last_threshold == pytest.approx(2e-3 * DECAY)
    # dense (ratio None): 1/16 > max -> grow
    assert a.calculate_threshold(3, 0, 1e-3, True, None, UPD) == pytest.approx(1e-3 / DECAY)
    assert a.last_sparsity == 1 / 16
    # no argument: continue from the stored threshold and sparsity
    stored = a.last_threshold
    assert a.calculate_threshold(4, 0, None, None, None, UPD) == pytest.approx(stored / DECAY)


def test_adaptive_without_sparsity_information_raises() -> None:
    a = AdaptiveThresholdAlgorithm(last_threshold=1e-3)
    with pytest.raises(ValueError, match="no previous sparsity"):
        a.calculate_threshold(0, 0, None, None, None, UPD)


def test_target_sparsity_rule_stores_every_branch() -> None:
    a = TargetSparsityThresholdAlgorithm(initial_threshold=1e-3, sparsity_target=1e-2)
    assert a.calculate_threshold(0, 0, None, None, None, UPD) == 1e-3
    assert a.calculate_threshold(1, 0, 1e-3, False, 1e-3, UPD) == pytest.approx(1e-3 * DECAY)
    assert a.calculate_threshold(2, 0, 1e-3, False, 2e-2, UPD) == pytest.approx(1e-3 / DECAY)
    assert a.calculate_threshold(3, 0, 5e-4, False, 1e-2, UPD) == 5e-4
    assert a.last_threshold == 5e-4 and a.last_sparsity == 1e-2
    assert a.calculate_threshold(4, 0, 5e-4, True, None, UPD) == pytest.approx(5e-4 / DECAY)


def test_fixed_threshold_and_reducer() -> None:
    f = FixedThresholdAlgorithm(0.25)
    assert f.calculate_threshold(5, 1, 1.0, True, None, UPD) == 0.25
    r = f.new_reducer()
    r.add(FixedThresholdAlgorithm(1.0))
    r.add(FixedThresholdAlgorithm(2.0))
    other = f.new_reducer()
    other.add(FixedThresholdAlgorithm(3.0))
    r.merge(other)
    assert r.final_result() == FixedThresholdAlgorithm(2.0)  # last added; merge keeps the existing one
    empty = f.new_reducer()
    empty.merge(other)
    assert empty.final_result() == FixedThresholdAlgorithm(3.0)


def test_adaptive_reducer_averages_state_like_dl4j() -> None:
    template = AdaptiveThresholdAlgorithm(initial_threshold=1e-3)
    r = template.new_reducer()
    r.add(AdaptiveThresholdAlgorithm(initial_threshold=1e-3, last_threshold=1e-3, last_sparsity=1e-2))
    r.add(AdaptiveThresholdAlgorithm(initial_threshold=1e-3, last_threshold=3e-3))  # nan sparsity: counted
    r.add(AdaptiveThresholdAlgorithm(initial_threshold=1e-3))  # nan threshold: skipped
    r.add(None)
    other = template.new_reducer()
    other.add(AdaptiveThresholdAlgorithm(initial_threshold=1e-3, last_threshold=2e-3, last_sparsity=2e-2))
    r.merge(other)
    result = r.final_result()
    assert result == template
    assert result.last_threshold == pytest.approx(2e-3)
    assert result.last_sparsity == pytest.approx(1e-2)  # (1e-2 + 2e-2) / 3
    # the averaged state seeds the next fit: the first call continues from it
    assert result.calculate_threshold(0, 0, None, None, None, UPD) == pytest.approx(2e-3)


def test_target_sparsity_reducer_always_adds_sparsity() -> None:
    template = TargetSparsityThresholdAlgorithm()
    r = template.new_reducer()
    r.add(TargetSparsityThresholdAlgorithm(last_threshold=1e-3, last_sparsity=1e-3))
    r.add(TargetSparsityThresholdAlgorithm(last_threshold=3e-3, last_sparsity=3e-3))
    result = r.final_result()
    assert (result.last_threshold, result.last_sparsity) == pytest.approx((2e-3, 2e-3))
    assert math.isnan(template.new_reducer().final_result().last_threshold)
    with pytest.raises(TypeError):
        r.add(AdaptiveThresholdAlgorithm())


def test_clone_keeps_state_and_is_independent() -> None:
    a = AdaptiveThresholdAlgorithm()
    a.calculate_threshold(0, 0, None, None, None, UPD)
    a.calculate_threshold(1, 0, None, True, None, UPD)
    b = a.clone()
    assert (b.last_threshold, b.last_sparsity) == (a.last_threshold, a.last_sparsity)
    b.calculate_threshold(2, 0, None, True, None, UPD)
    assert b.last_threshold != a.last_threshold


@pytest.mark.parametrize(
    "config",
    [
        FixedThresholdAlgorithm(0.5),
        AdaptiveThresholdAlgorithm(2e-4, 1e-4, 1e-3, 0.9),
        AdaptiveThresholdAlgorithm(last_threshold=1e-3, last_sparsity=0.01),
        TargetSparsityThresholdAlgorithm(1e-3, 1e-2, 0.75),
        TargetSparsityThresholdAlgorithm(written_cap=False),
        ResidualClippingPostProcessor(3.0, 7),
        NoOpResidualPostProcessor(),
    ],
)
def test_round_trip_json_yaml(config) -> None:
    for back in (type(config).from_json(config.to_json()), type(config).from_yaml(config.to_yaml())):
        assert back == config
        assert back.to_dict() == config.to_dict()  # state (nan included) survives too


def test_equality_ignores_state() -> None:
    assert AdaptiveThresholdAlgorithm(last_threshold=1.0) == AdaptiveThresholdAlgorithm()
    assert AdaptiveThresholdAlgorithm(initial_threshold=1.0) != AdaptiveThresholdAlgorithm()


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: FixedThresholdAlgorithm(0.0), "threshold"),
        (lambda: AdaptiveThresholdAlgorithm(initial_threshold=-1), "initial_threshold"),
        (lambda: AdaptiveThresholdAlgorithm(min_target_sparsity=0), "min_target_sparsity"),
        (lambda: AdaptiveThresholdAlgorithm(max_target_sparsity=0), "max_target_sparsity"),
        (
            lambda: AdaptiveThresholdAlgorithm(min_target_sparsity=0.1, max_target_sparsity=0.01),
            "min_target_sparsity",
        ),
        (lambda: AdaptiveThresholdAlgorithm(decay_rate=0.4), "decay_rate"),
        (lambda: AdaptiveThresholdAlgorithm(decay_rate=1.0), "decay_rate"),
        (lambda: AdaptiveThresholdAlgorithm(last_threshold=-1.0), "last_threshold"),
        (lambda: TargetSparsityThresholdAlgorithm(sparsity_target=1 / 16), "sparsity_target"),
        (lambda: TargetSparsityThresholdAlgorithm(sparsity_target=0), "sparsity_target"),
        (lambda: TargetSparsityThresholdAlgorithm(decay_rate="x"), "decay_rate"),
        (lambda: TargetSparsityThresholdAlgorithm(written_cap=1), "written_cap"),
        (lambda: ResidualClippingPostProcessor(0.5, 5), "threshold_multiple_clip_value"),
        (lambda: ResidualClippingPostProcessor(5.0, 0), "frequency"),
        (
            lambda: AdaptiveThresholdAlgorithm.from_json(
                '{"@type": "AdaptiveThresholdAlgorithm", "bogus": 1}'
            ),
            "bogus",
        ),
    ],
)
def test_invalid_arguments_name_the_field(factory, field) -> None:
    with pytest.raises(ValueError, match=field):
        factory()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_residual_clipping_rule(dtype) -> None:
    p = ResidualClippingPostProcessor(2.0, 3)
    base = np.array([-5.0, -0.3, 0.0, 0.1, 0.25, 9.0, np.nan], dtype=dtype)
    for iteration, clipped in [(0, False), (1, False), (3, True), (4, False), (6, True)]:
        r = base.copy()
        p.process_residual(iteration, 0, 0.1, r)
        limit = dtype(0.1 * 2.0)
        expected = np.clip(base, -limit, limit) if clipped else base
        np.testing.assert_array_equal(r, expected)
    r = base.copy()
    NoOpResidualPostProcessor().process_residual(5, 0, 0.1, r)
    np.testing.assert_array_equal(r, base)


def test_start_at_target_takes_the_first_residuals_target_quantile() -> None:
    # 2,000 elements at a 1e-3 target: the first threshold is the 2nd largest magnitude
    residual = np.linspace(-1e-4, 1e-4, 2000).astype(np.float32)
    residual[[7, 1500]] = [-3e-3, 5e-3]
    algorithm = TargetSparsityThresholdAlgorithm(2e-2, 1e-3, start_at_target=True)
    assert algorithm.calculate_threshold(0, 0, None, None, None, residual) == pytest.approx(3e-3)
    assert algorithm.last_threshold == pytest.approx(3e-3)
    # capped by initial_threshold, and DL4J's start without the flag
    capped = TargetSparsityThresholdAlgorithm(1e-3, 1e-3, start_at_target=True)
    assert capped.calculate_threshold(0, 0, None, None, None, residual) == 1e-3
    plain = TargetSparsityThresholdAlgorithm(2e-2, 1e-3)
    assert plain.calculate_threshold(0, 0, None, None, None, residual) == 2e-2
    # nothing to measure (all zero): initial_threshold
    zeros = TargetSparsityThresholdAlgorithm(2e-2, 1e-3, start_at_target=True)
    assert zeros.calculate_threshold(0, 0, None, None, None, np.zeros(100, np.float32)) == 2e-2
    with pytest.raises(ValueError, match="start_at_target"):
        TargetSparsityThresholdAlgorithm(2e-2, 1e-3, start_at_target=1)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 5000),
    nonzero=st.floats(0.0, 1.0),
    specials=st.sampled_from(["none", "nan", "inf"]),
    target=st.sampled_from([1e-3, 1e-2, 6e-2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_start_at_target_is_the_quantile_of_every_magnitude(size, nonzero, specials, target, seed) -> None:
    """Only the non-zeros are partitioned: the same threshold as the target quantile of all |residual|."""
    rng = np.random.default_rng(seed)
    residual = (rng.normal(size=size) * 1e-3 * (rng.random(size) < nonzero)).astype(np.float32)
    if specials != "none":
        residual[rng.integers(0, size)] = np.nan if specials == "nan" else -np.inf
    magnitudes = np.abs(residual)
    k = min(size, max(1, math.ceil(target * size)))
    kth = float(np.partition(magnitudes, size - k)[size - k])
    want = min(max(kth, MIN_THRESHOLD), 2e-2) if math.isfinite(kth) and kth > 0 else 2e-2
    algorithm = TargetSparsityThresholdAlgorithm(2e-2, target, start_at_target=True)
    assert algorithm.calculate_threshold(0, 0, None, None, None, residual) == want


@pytest.mark.parametrize("start_at_target", [True, False])
def test_threshold_rises_twice_as_fast_while_catching_up(start_at_target: bool) -> None:
    # a threshold seeded at 1e-3 (target 1e-3), then one message per row: sparsity -> factor it moves by
    decay = 0.9
    rows = [
        (CATCH_UP_SPARSITY * 1e-3 * 1.5, decay**-2 if start_at_target else decay**-1),  # far above: catch up
        (CATCH_UP_SPARSITY * 1e-3, decay**-1),  # at the catch-up bound: the usual rise
        (2e-3, decay**-1),
        (1e-3, 1.0),
        (5e-4, decay),
    ]
    for sparsity, factor in rows:
        algorithm = TargetSparsityThresholdAlgorithm(
            2e-2, 1e-3, decay_rate=decay, start_at_target=start_at_target, last_threshold=1e-3
        )
        threshold = algorithm.calculate_threshold(5, 0, None, False, sparsity, np.zeros(4, np.float32))
        assert threshold == pytest.approx(1e-3 * factor, rel=1e-12), sparsity


def test_default_threshold_algorithm_starts_at_the_first_updates() -> None:
    algorithm = default_threshold_algorithm()
    # by value: a changed default fails here (and in test_masters' defaults test), not only its docs
    assert (DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET) == (2e-2, 3e-3)
    assert algorithm == TargetSparsityThresholdAlgorithm(2e-2, 3e-3, start_at_target=True)
    assert algorithm.decay_rate == 0.5 ** (1 / 20)
    assert math.isnan(algorithm.last_threshold) and math.isnan(algorithm.last_sparsity)
    # magnitudes 4e-3, 3.999e-3, ... 1e-6, all distinct: 12 of 4,000 at the 3e-3 target, so the first
    # threshold is the 12th largest magnitude (a 1e-3 target would give the 4th, 3.997e-3)
    update = (np.arange(4000, 0, -1) * 1e-6).astype(np.float32)
    assert algorithm.calculate_threshold(0, 0, None, None, None, update) == float(update[11])
    assert update[11] == np.float32(3.989e-3)


def test_update_scale_by_combination() -> None:
    assert update_scale("sum", 4) == 1.0
    assert update_scale("mean", 4) == 0.25
    assert update_scale("sqrt", 4) == 0.5
    assert update_scale("sqrt", 4, [updaters.Adam()]) == 0.5  # a named combination ignores the updaters
    assert DEFAULT_UPDATE_COMBINATION == "auto"
    with pytest.raises(
        ValueError, match="update_combination: expected one of auto, sqrt, mean, sum, got 'avg'"
    ):
        update_scale("avg", 2)


def test_auto_sums_the_updates_of_the_adam_family_and_rmsprop_only() -> None:
    """ "auto" sums when every updater that trains parameters divides its step by a running average of the
    squared gradients; any other updater among them (or none known) gives the square-root rule."""
    summed = [updaters.Adam(), updaters.AdaMax(), updaters.Nadam(), updaters.AmsGrad(), updaters.RmsProp()]
    assert sorted(u.kind for u in summed) == sorted(SUMMED_UPDATERS)
    assert update_scale("auto", 4, summed) == 1.0
    assert update_scale("auto", 4, [updaters.NoOp(), updaters.Adam()]) == 1.0  # a frozen layer takes no step
    assert update_combination_for("auto", [updaters.RmsProp()]) == "sum"
    for others in (
        [updaters.Sgd()],
        [updaters.Nesterovs()],
        [updaters.AdaGrad()],
        [updaters.AdaDelta()],
        [updaters.Adam(), updaters.Sgd()],
        [updaters.NoOp()],
        [],
    ):
        assert update_scale("auto", 4, others) == 0.5, others
        assert update_combination_for("auto", others) == "sqrt"
    with pytest.raises(ValueError, match="update_combination"):
        update_combination_for("Auto", [updaters.Adam()])


def test_reference_length_caps_a_row_sparse_steps_target_at_what_it_wrote() -> None:
    """TargetSparsity measures a row-sparse step's message against min(N, written / target): it aims at
    min(target * N, written) entries; every other algorithm, a dense step and written_cap=False use N."""
    capped = TargetSparsityThresholdAlgorithm(sparsity_target=1e-3)
    assert capped.reference_length(1_000_000, None) == 1_000_000
    assert capped.reference_length(1_000_000, 100) == 100_000  # aims at 100 entries, not 1,000
    assert capped.reference_length(1_000_000, 5_000) == 1_000_000  # wrote more than 1,000: unchanged
    assert capped.reference_length(1_000_000, 0) == 1
    assert (
        TargetSparsityThresholdAlgorithm(sparsity_target=1e-3, written_cap=False).reference_length(
            1_000_000, 100
        )
        == 1_000_000
    )
    assert AdaptiveThresholdAlgorithm().reference_length(1_000_000, 100) == 1_000_000
    assert FixedThresholdAlgorithm(0.5).reference_length(1_000_000, 100) == 1_000_000


@pytest.mark.parametrize("written_cap", [True, False])
def test_row_sparse_messages_aim_at_no_more_entries_than_a_step_writes(written_cap: bool) -> None:
    """Steps that write 40 of 200,000 elements (target 1e-3: 200 entries): with the cap the threshold
    settles where a message carries about what a step wrote; without it, where it carries 200 (residual
    left in elements written earlier makes up the difference)."""
    n, written, target = 200_000, 40, 1e-3
    algorithm = TargetSparsityThresholdAlgorithm(0.05, target, start_at_target=True, written_cap=written_cap)
    handler = EncodingHandler(n, algorithm, NoOpResidualPostProcessor(), dtype="float32")
    rng = np.random.default_rng(11)
    entries = []
    for step in range(400):
        support = np.unique(rng.integers(0, n, written))
        update = np.zeros(n, np.float32)
        update[support] = rng.normal(0, 0.01, support.size)
        message = handler.encode(update, step, 0, support=support)
        entries.append(0 if message is None else int(message[0]))
    settled = float(np.mean(entries[-100:]))
    if written_cap:
        assert 0.5 * written <= settled <= 2 * written
    else:
        assert 0.5 * target * n <= settled <= 1.5 * target * n


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(["fixed", "adaptive", "target", "target_at_start"]),
    decay=st.floats(0.5, 0.999999),
    steps=st.lists(st.tuples(st.booleans(), st.floats(0.0, 1.0)), min_size=1, max_size=40),
)
def test_no_step_raises_the_threshold_past_max_step_growth(kind, decay, steps) -> None:
    """The controller's threshold bound lets a worker ahead of another climb by max_step_growth per
    update (transport.policies): no sequence of sparsities may raise a threshold faster."""
    algorithm = {
        "fixed": lambda: FixedThresholdAlgorithm(1e-3),
        "adaptive": lambda: AdaptiveThresholdAlgorithm(1e-3, 1e-3, 1e-2, decay_rate=decay),
        "target": lambda: TargetSparsityThresholdAlgorithm(1e-3, 1e-3, decay_rate=decay),
        "target_at_start": lambda: TargetSparsityThresholdAlgorithm(
            1e-3, 1e-3, decay_rate=decay, start_at_target=True
        ),
    }[kind]()
    growth = algorithm.max_step_growth()
    assert growth == {"fixed": 1.0, "adaptive": 1 / decay, "target": 1 / decay}.get(kind, 1 / decay**2)
    threshold = algorithm.calculate_threshold(0, 0, None, None, None, np.full(4, 1e-3, np.float32))
    for k, (dense, sparsity) in enumerate(steps, start=1):
        ratio = None if dense else sparsity
        following = algorithm.calculate_threshold(k, 0, threshold, dense, ratio, UPD)
        assert following <= threshold * growth * (1 + 4 * np.finfo(np.float64).eps)
        threshold = following

"""Learning-rate schedules (sparkgrad.nn.schedules, DL4J's ISchedule): each schedule's formula in float64,
validation, persistence, and training with a schedule == training step by step with the constant rates
the schedule gives (the counters DL4J reads: iteration and epoch before the step's increment), on a
MultiLayerNetwork, a ComputationGraph, the emulated device and a ParallelWrapper."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from typing import Any, Callable

import numpy as np
import pytest
from emulated_device import EmulatedDevice
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    schedules,
    updaters,
)
from sparkgrad.nn.schedules import (
    CycleSchedule,
    ExponentialSchedule,
    FixedSchedule,
    InverseSchedule,
    MapSchedule,
    PolySchedule,
    RampSchedule,
    Schedule,
    ScheduleType,
    SigmoidSchedule,
    StepSchedule,
)
from sparkgrad.parallel import ParallelWrapper

IT, EP = ScheduleType.ITERATION, ScheduleType.EPOCH
TYPES = [IT, EP]
counts = st.integers(min_value=0, max_value=10_000)


def _t(kind: ScheduleType, iteration: int, epoch: int) -> int:
    return iteration if kind is IT else epoch


# -- formulas ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", TYPES)
@settings(max_examples=60, deadline=None)
@given(iteration=counts, epoch=counts, v=st.floats(0.0, 10.0), gamma=st.floats(0.5, 1.0))
def test_exponential(kind: ScheduleType, iteration: int, epoch: int, v: float, gamma: float) -> None:
    t = _t(kind, iteration, epoch)
    got = ExponentialSchedule(kind, v, gamma).value_at(iteration, epoch)
    assert got == pytest.approx(v * np.power(np.float64(gamma), t), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("kind", TYPES)
@settings(max_examples=60, deadline=None)
@given(iteration=counts, epoch=counts, gamma=st.floats(0.0, 2.0), power=st.floats(-1.0, 3.0))
def test_inverse(kind: ScheduleType, iteration: int, epoch: int, gamma: float, power: float) -> None:
    t = _t(kind, iteration, epoch)
    got = InverseSchedule(kind, 0.3, gamma, power).value_at(iteration, epoch)
    assert got == pytest.approx(0.3 / np.power(1.0 + gamma * np.float64(t), power), rel=1e-12)


@pytest.mark.parametrize("kind", TYPES)
@settings(max_examples=60, deadline=None)
@given(iteration=counts, epoch=counts, power=st.floats(0.0, 3.0), max_iter=st.integers(1, 12_000))
def test_poly(kind: ScheduleType, iteration: int, epoch: int, power: float, max_iter: int) -> None:
    t = _t(kind, iteration, epoch)
    expected = 0.0 if t >= max_iter else 0.2 * np.power(1.0 - np.float64(t) / max_iter, power)
    assert PolySchedule(kind, 0.2, power, max_iter).value_at(iteration, epoch) == pytest.approx(
        expected, rel=1e-12, abs=1e-300
    )


@pytest.mark.parametrize("kind", TYPES)
@settings(max_examples=60, deadline=None)
@given(iteration=counts, epoch=counts, gamma=st.floats(-2.0, 2.0), step=st.integers(0, 10_000))
def test_sigmoid(kind: ScheduleType, iteration: int, epoch: int, gamma: float, step: int) -> None:
    t = _t(kind, iteration, epoch)
    with np.errstate(over="ignore"):
        expected = 0.5 / (1.0 + np.exp(-gamma * (np.float64(t) - step)))
    got = SigmoidSchedule(kind, 0.5, gamma, step).value_at(iteration, epoch)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("kind", TYPES)
@settings(max_examples=60, deadline=None)
@given(iteration=counts, epoch=counts, rate=st.floats(0.1, 1.0), step=st.floats(0.5, 50.0))
def test_step(kind: ScheduleType, iteration: int, epoch: int, rate: float, step: float) -> None:
    t = _t(kind, iteration, epoch)
    expected = 0.1 * np.power(np.float64(rate), np.floor(np.float64(t) / step))
    got = StepSchedule(kind, 0.1, rate, step).value_at(iteration, epoch)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_step_boundaries() -> None:
    s = StepSchedule(IT, 1.0, 0.5, 3)
    assert [s.value_at(i, 99) for i in range(7)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    assert [StepSchedule(EP, 1.0, 0.5, 2).value_at(99, e) for e in range(4)] == [1.0, 1.0, 0.5, 0.5]


@pytest.mark.parametrize("kind", TYPES)
def test_map_is_piecewise_constant(kind: ScheduleType) -> None:
    s = MapSchedule(kind, {5: 0.01, 0: 0.1, 2: 0.05})
    expected = [0.1, 0.1, 0.05, 0.05, 0.05, 0.01, 0.01, 0.01]
    assert [s.value_at(t, 0) if kind is IT else s.value_at(0, t) for t in range(8)] == expected
    assert s.value_at(10**9, 10**9) == 0.01
    assert list(s.values) == [0, 2, 5]


def test_poly_edges() -> None:
    s = PolySchedule(IT, 0.4, 1.0, 4)
    assert [s.value_at(i, 0) for i in range(6)] == [0.4, 0.30000000000000004, 0.2, 0.1, 0.0, 0.0]


def test_ramp_warms_up_linearly_to_the_base() -> None:
    base = ExponentialSchedule(IT, 0.8, 0.99)
    ramp = RampSchedule(base, 4)
    for i in range(8):
        expected = base.value_at(i, 0) * (min(i + 1, 4) / 4)
        assert ramp.value_at(i, 3) == pytest.approx(expected, rel=1e-15)
    assert ramp.value_at(0, 0) == 0.8 / 4  # DL4J: starts at base / num_iter, not 0
    assert ramp.value_at(3, 0) == base.value_at(3, 0)  # full base at num_iter - 1
    epoch_base = MapSchedule(EP, {0: 1.0, 1: 0.5})
    assert RampSchedule(epoch_base, 10).value_at(4, 1) == 0.5 * 5 / 10  # ramps iterations, base reads epochs
    assert RampSchedule(0.2, 2).value_at(0, 0) == 0.1  # a constant base
    assert RampSchedule(FixedSchedule(0.2), 1).value_at(0, 0) == 0.2


@pytest.mark.parametrize("kind", TYPES)
def test_cycle(kind: ScheduleType) -> None:
    s = CycleSchedule(kind, 0.1, 1.0, 10, 2, 0.5)  # step size 4
    values = [s.value_at(t, 0) if kind is IT else s.value_at(0, t) for t in range(21)]
    inc = (1.0 - 0.1) / 4
    expected = [0.1 + inc * p for p in range(4)] + [1.0 - inc * (p - 4) for p in range(4, 8)]
    expected += [0.1 * 0.5 ** (2 - (10 - p)) for p in (8, 9)]
    assert values == pytest.approx(expected * 2 + expected[:1], rel=1e-15)
    d = CycleSchedule.of(kind, 0.5, 25)  # DL4J's defaults: initial = max / 10, annealing round(2.5) = 3
    assert (d.initial_learning_rate, d.max_learning_rate, d.annealing_length, d.annealing_decay) == (
        0.05,
        0.5,
        3,
        0.1,
    )


def test_value_at_zero_is_the_initial_value() -> None:
    for s in (
        ExponentialSchedule(IT, 0.3, 0.5),
        InverseSchedule(EP, 0.3, 1.0, 2.0),
        PolySchedule(IT, 0.3, 2.0, 10),
        StepSchedule(EP, 0.3, 0.1, 1),
        MapSchedule(IT, {0: 0.3}),
        FixedSchedule(0.3),
        CycleSchedule(IT, 0.3, 1.0, 10, 2),
    ):
        assert s.value_at(0, 0) == 0.3, s
    assert SigmoidSchedule(IT, 0.3, 1.0, 0).value_at(0, 0) == 0.15


def test_overflow_gives_zero_or_inf_not_an_exception() -> None:
    assert SigmoidSchedule(IT, 1.0, -1.0, 0).value_at(10**6, 0) == 0.0
    assert math.isinf(ExponentialSchedule(IT, 1.0, 2.0).value_at(10**6, 0))


# -- validation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ExponentialSchedule(IT, 0.1, -0.5), "gamma"),
        (lambda: ExponentialSchedule(IT, 0.1, 0.0), "gamma"),
        (lambda: ExponentialSchedule(IT, math.nan, 0.5), "initial_value"),
        (lambda: ExponentialSchedule(IT, -0.1, 0.5), "initial_value"),
        (lambda: ExponentialSchedule("daily", 0.1, 0.5), "schedule_type"),
        (lambda: InverseSchedule(IT, 0.1, -1.0, 1.0), "gamma"),
        (lambda: InverseSchedule(IT, 0.1, 1.0, math.inf), "power"),
        (lambda: PolySchedule(IT, 0.1, 1.0, 0), "max_iter"),
        (lambda: PolySchedule(IT, 0.1, -1.0, 5), "power"),
        (lambda: PolySchedule(IT, 0.1, 1.0, 2.5), "max_iter"),
        (lambda: SigmoidSchedule(IT, 0.1, "1", 5), "gamma"),
        (lambda: SigmoidSchedule(IT, 0.1, 1.0, -1), "step_size"),
        (lambda: StepSchedule(IT, 0.1, 0.5, 0), "step"),
        (lambda: StepSchedule(IT, 0.1, -0.5, 1), "decay_rate"),
        (lambda: MapSchedule(IT, {1: 0.1}), "values"),
        (lambda: MapSchedule(IT, {}), "values"),
        (lambda: MapSchedule(IT, [(0, 0.1)]), "values"),
        (lambda: MapSchedule(IT, {0: 0.1, -1: 0.2}), "values key"),
        (lambda: MapSchedule(IT, {0: 0.1, "x": 0.2}), "values key"),
        (lambda: MapSchedule(IT, {0: math.inf}), "values[0]"),
        (lambda: MapSchedule(IT, {0: True}), "values[0]"),
        (lambda: RampSchedule("fast", 5), "base_schedule"),
        (lambda: RampSchedule(FixedSchedule(0.1), 0), "num_iter"),
        (lambda: CycleSchedule(IT, 0.1, 1.0, 10, 9), "annealing_length"),
        (lambda: CycleSchedule(IT, 0.1, 1.0, 1, 0), "cycle_length"),
        (lambda: updaters.Sgd("0.1"), "learning_rate"),
        (lambda: updaters.Adam(MapSchedule(IT, {0: 2e6})), "values[0]"),
        (lambda: updaters.Adam(PolySchedule(IT, 0.1, 1.0, 1)), None),
        (lambda: updaters.Nesterovs(0.1, momentum=FixedSchedule(1.0)), "momentum"),
        (lambda: updaters.Nesterovs(0.1, momentum=1.0), "momentum"),
        (lambda: updaters.Sgd(0.0), "learning_rate"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make: Callable[[], Any], field: str | None) -> None:
    if field is None:  # valid: a schedule may decay to 0 after its start
        make()
        return
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}"):
        make()


def test_a_scheduled_value_out_of_range_fails_the_step_naming_the_field() -> None:
    net = _mlp(updaters.Nesterovs(0.1, momentum=StepSchedule(IT, 0.5, 2.5, 2)))
    data = _batches(net, 3)
    net.fit(data[:2])  # momentum 0.5 at iterations 0 and 1
    params, state = net.params().copy(), net.updater_state().copy()
    with pytest.raises(ValueError, match=r"^momentum: StepSchedule gives 1.25 at iteration 2, epoch 1"):
        net.fit(data[2])
    np.testing.assert_array_equal(net.params(), params)
    np.testing.assert_array_equal(net.updater_state(), state)
    assert net.iteration_count == 2
    grow = _mlp(updaters.Sgd(ExponentialSchedule(IT, 1.0, 1e4)))
    with pytest.raises(
        ValueError, match=r"^learning_rate: ExponentialSchedule gives 100000000.0 at iteration 2, epoch 0"
    ):
        grow.fit(_batches(grow, 3))


# -- training --------------------------------------------------------------------------------------------
def _mlp(updater: updaters.Updater, weight_decay: float = 0.0) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(5, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(4),
        updater=updater,
        seed=3,
        dtype="float64",
        weight_decay=weight_decay,
    )
    return MultiLayerNetwork(conf).init()


def _graph(updater: updaters.Updater, weight_decay: float = 0.0) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(
            updater=updater, seed=5, dtype="float64", weight_decay=weight_decay
        )
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(6, activation="tanh"), "x")
        .add_layer("out", OutputLayer(3), "a")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf).init()


BUILDERS = {"mln": _mlp, "graph": _graph}


def _batches(net: Any, n: int, seed: int = 0) -> list[DataSet]:
    rng = np.random.default_rng(seed)
    return [DataSet(rng.normal(size=(6, 4)), np.eye(3)[rng.integers(0, 3, 6)]) for _ in range(n)]


def _with_lr(updater: updaters.Updater, lr: float, momentum: float | None = None) -> updaters.Updater:
    changes: dict[str, Any] = {"learning_rate": lr}
    if momentum is not None:
        changes["momentum"] = momentum
    return dataclasses.replace(updater, **changes)


def _step_by_step(
    build: Callable[..., Any],
    updater: updaters.Updater,
    batches_per_epoch: list[list[DataSet]],
    weight_decay: float,
) -> Any:
    """Train one step at a time, each on a fresh network whose updater has the constant rates the
    schedules give at that step's (iteration, epoch); parameters, state and counters carried over."""
    net = build(updater, weight_decay)
    for batches in batches_per_epoch:
        for batch in batches:
            it, ep = net.iteration_count, net.epoch_count
            lr = schedules.value_of(updater.learning_rate, it, ep)
            momentum = getattr(updater, "momentum", None)
            m = None if momentum is None else schedules.value_of(momentum, it, ep)
            step = build(_with_lr(updater, lr, m), weight_decay)
            step.init(net.params().copy())
            step.set_updater_state(net.updater_state())
            step.iteration_count, step.epoch_count = it, ep
            step.apply_update(step.compute_update(batch)[0])  # fit would count an epoch
            net = step
        net.epoch_count += 1
    return net


UPDATERS = {
    "sgd": lambda s: updaters.Sgd(s),
    "nesterovs": lambda s: updaters.Nesterovs(s, momentum=MapSchedule(IT, {0: 0.5, 2: 0.9})),
    "adam": lambda s: updaters.Adam(s),
}


@pytest.mark.parametrize("network", sorted(BUILDERS))
@pytest.mark.parametrize("name", sorted(UPDATERS))
def test_iteration_schedule_equals_constant_rates_step_by_step(network: str, name: str) -> None:
    build = BUILDERS[network]
    updater = UPDATERS[name](ExponentialSchedule(IT, 0.1, 0.5))
    scheduled = build(updater, 1e-3)
    data = _batches(scheduled, 5)
    scheduled.fit(data)
    reference = _step_by_step(build, updater, [data], 1e-3)
    np.testing.assert_array_equal(scheduled.params(), reference.params())
    np.testing.assert_array_equal(scheduled.updater_state(), reference.updater_state())
    constant = build(UPDATERS[name](0.1), 1e-3).fit(data)  # the schedule did change the result
    assert not np.array_equal(scheduled.params(), constant.params())


@dataclasses.dataclass
class _Recording(Schedule):
    """Records the counters each step asks about."""

    calls: list = dataclasses.field(default_factory=list)

    def value_at(self, iteration: int, epoch: int) -> float:
        self.calls.append((iteration, epoch))
        return 0.1


def test_steps_read_the_counters_before_their_increment() -> None:
    recording = _Recording()
    net = _mlp(updaters.Sgd(recording))
    recording.calls.clear()  # construction checks the value at (0, 0)
    net.fit(_batches(net, 2), epochs=3)
    # each step may ask more than once (a range check before the state changes), never about another step
    assert list(dict.fromkeys(recording.calls)) == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]


@pytest.mark.parametrize("network", sorted(BUILDERS))
def test_epoch_schedule_changes_only_at_epoch_boundaries(network: str) -> None:
    build = BUILDERS[network]
    updater = updaters.Nesterovs(StepSchedule(EP, 0.1, 0.3, 1), momentum=0.9)
    scheduled = build(updater, 0.0)
    data = _batches(scheduled, 2)
    scheduled.fit(data, epochs=3)
    reference = _step_by_step(build, updater, [data] * 3, 0.0)
    np.testing.assert_array_equal(scheduled.params(), reference.params())
    # an iteration schedule with the same numbers would have changed the rate within the epochs
    per_iteration = build(updaters.Nesterovs(StepSchedule(IT, 0.1, 0.3, 1), momentum=0.9), 0.0)
    per_iteration.fit(data, epochs=3)
    assert not np.array_equal(scheduled.params(), per_iteration.params())


def test_ramp_warm_up_trains_like_the_ramped_constants() -> None:
    updater = updaters.Sgd(RampSchedule(FixedSchedule(0.2), 4))
    warm = _mlp(updater)
    data = _batches(warm, 6)
    warm.fit(data)
    reference = _step_by_step(_mlp, updater, [data], 0.0)
    np.testing.assert_array_equal(warm.params(), reference.params())
    rates = [updater.learning_rate_at(i, 0) for i in range(6)]
    assert rates == [0.05, 0.1, 0.15000000000000002, 0.2, 0.2, 0.2]


# -- persistence ---------------------------------------------------------------------------------------
ALL = [
    ExponentialSchedule(IT, 0.1, 0.9),
    InverseSchedule(EP, 0.1, 0.5, 2.0),
    PolySchedule(IT, 0.1, 2.0, 100),
    SigmoidSchedule(EP, 0.1, -0.5, 3),
    StepSchedule(IT, 0.1, 0.5, 2.5),
    MapSchedule(EP, {0: 0.1, 10: 0.01}),
    FixedSchedule(0.1),
    RampSchedule(MapSchedule(IT, {0: 0.1, 3: 0.05}), 10),
    RampSchedule(0.1, 3),
    CycleSchedule(IT, 0.01, 0.1, 20, 4, 0.5),
]


@pytest.mark.parametrize("schedule", ALL, ids=[type(s).__name__ for s in ALL])
def test_schedules_round_trip_through_json_and_yaml(schedule: Schedule) -> None:
    for updater in (
        updaters.Adam(schedule),
        updaters.Nesterovs(schedule, momentum=MapSchedule(EP, {0: 0.5})),
    ):
        conf = _mlp(updater).conf
        for back in (
            MultiLayerConfiguration.from_json(conf.to_json()),
            MultiLayerConfiguration.from_yaml(conf.to_yaml()),
        ):
            assert back == conf
            assert back.updater.learning_rate == schedule
            assert back.updater.learning_rate_at(7, 2) == schedule.value_at(7, 2)


def test_graph_configuration_round_trips_a_schedule() -> None:
    conf = _graph(updaters.Sgd(MapSchedule(IT, {0: 0.1, 3: 0.01}))).conf
    assert ComputationGraphConfiguration.from_json(conf.to_json()) == conf


def test_a_configuration_without_schedules_still_loads() -> None:
    old = '{"@type": "Adam", "learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-08}'
    assert updaters.Updater.from_json(old) == updaters.Adam(0.01)


@pytest.mark.parametrize("network", sorted(BUILDERS))
def test_model_file_keeps_the_schedule_and_training_continues_identically(network: str) -> None:
    build = BUILDERS[network]
    updater = updaters.Adam(StepSchedule(IT, 0.05, 0.5, 2))
    net = build(updater, 1e-3)
    data = _batches(net, 6)
    net.fit(data[:3])
    buffer = io.BytesIO()
    net.save(buffer)
    buffer.seek(0)
    loaded = type(net).load(buffer)
    assert loaded.conf == net.conf and loaded.iteration_count == 3
    net.fit(data[3:])
    loaded.fit(data[3:])
    np.testing.assert_array_equal(loaded.params(), net.params())
    whole = build(updater, 1e-3).fit(data)
    np.testing.assert_array_equal(whole.params(), net.params())


# -- devices and wrappers ------------------------------------------------------------------------------
def test_emulated_device_trains_bitwise_like_the_cpu_with_a_schedule() -> None:
    updater = updaters.Nesterovs(RampSchedule(ExponentialSchedule(IT, 0.1, 0.8), 3), momentum=0.9)
    cpu = _mlp(updater, 1e-3)
    on_device = _mlp(updater, 1e-3).to(EmulatedDevice())
    data = _batches(cpu, 5)
    cpu.fit(data, epochs=2)
    on_device.fit(data, epochs=2)
    np.testing.assert_array_equal(on_device.params(), cpu.params())
    constant = _mlp(updaters.Nesterovs(0.1, momentum=0.9), 1e-3).fit(data, epochs=2)
    assert not np.array_equal(cpu.params(), constant.params())


def test_parallel_wrapper_fit_with_a_schedule() -> None:
    updater = updaters.Sgd(ExponentialSchedule(IT, 0.1, 0.7))
    plain, wrapped = _mlp(updater), _mlp(updater)
    data = _batches(plain, 4)
    plain.fit(data, epochs=2)
    ParallelWrapper(wrapped, workers=1, averaging_frequency=2, training_mode="averaging").fit(data, epochs=2)
    np.testing.assert_array_equal(wrapped.params(), plain.params())
    assert wrapped.iteration_count == 8
    two = _mlp(updater)
    ParallelWrapper(two, workers=2, averaging_frequency=1, training_mode="averaging").fit(data, epochs=1)
    assert np.isfinite(two.params()).all() and two.iteration_count > 0

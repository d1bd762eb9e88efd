"""The shared configuration mechanism: JSON/YAML round trips, registry, validation messages."""

from __future__ import annotations

import dataclasses
import enum

import pytest

from sparkgrad._config import Config, check_positive, coerce_enum


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

"""Configuration objects as data: dataclasses that validate on construction and round-trip through
JSON and YAML with equality preserved.

Every configuration class (layers, updaters, threshold algorithms, training masters, ...) is a
dataclass deriving from :class:`Config`. Serialised form: a mapping with the class's registered name
under ``"@type"`` and one key per dataclass field. Nested configs, lists/tuples of configs and enums
are handled recursively; tuples are restored as tuples. Unknown fields, a missing or foreign
``"@type"`` and values that fail the class's own validation raise ``ValueError`` naming the field.

Subclasses validate in ``__post_init__`` with the helpers below (``check_positive`` ...), so an
object built by hand and one read back from JSON go through exactly the same checks.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any, ClassVar, TypeVar

import yaml

C = TypeVar("C", bound="Config")
E = TypeVar("E", bound=enum.Enum)

_TYPE_KEY = "@type"
_TUPLE_KEY = "@tuple"


class Config:
    """Mixin for dataclass configurations: registry of subclasses by name plus (de)serialisation."""

    _registry: ClassVar[dict[str, type[Config]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        existing = Config._registry.get(cls.__name__)
        if existing is not None and existing.__module__ != cls.__module__:
            raise TypeError(f"config class name {cls.__name__!r} is registered twice")
        Config._registry[cls.__name__] = cls

    # -- dict form -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The serialisable mapping: ``{"@type": class name, field: value, ...}``."""
        out: dict[str, Any] = {_TYPE_KEY: type(self).__name__}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.init:
                out[f.name] = _encode(getattr(self, f.name))
        return out

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """Rebuild a config from :meth:`to_dict` output; ``cls`` may be a base class of the stored type."""
        obj = _decode(data, expected=cls, where=cls.__name__)
        if not isinstance(obj, cls):
            raise ValueError(f"expected a {cls.__name__} configuration, got {type(obj).__name__}")
        return obj

    # -- text forms ----------------------------------------------------------------------------
    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=True)

    @classmethod
    def from_json(cls: type[C], text: str) -> C:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{cls.__name__}.from_json: not valid JSON ({exc})") from exc
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls: type[C], text: str) -> C:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{cls.__name__}.from_yaml: not valid YAML ({exc})") from exc
        return cls.from_dict(data)


def _encode(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return {_TUPLE_KEY: [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan"/"inf" survive YAML and JSON alike
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


def _decode(value: Any, expected: type | None = None, where: str = "") -> Any:
    if isinstance(value, dict) and _TYPE_KEY in value:
        name = value[_TYPE_KEY]
        cls = Config._registry.get(name)
        if cls is None:
            raise ValueError(f"{where}: unknown configuration type {name!r}")
        if expected is not None and isinstance(expected, type) and not issubclass(cls, expected):
            raise ValueError(f"{where}: expected a {expected.__name__} configuration, got {name!r}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        kwargs = {}
        for key, raw in value.items():
            if key == _TYPE_KEY:
                continue
            if key not in fields:
                raise ValueError(f"{name}: unknown field {key!r}")
            kwargs[key] = _decode(raw, where=f"{name}.{key}")
        return cls(**kwargs)
    if isinstance(value, dict) and set(value) == {_TUPLE_KEY}:
        return tuple(_decode(v, where=where) for v in value[_TUPLE_KEY])
    if isinstance(value, dict):
        return {k: _decode(v, where=f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, where=where) for v in value]
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if expected is not None and issubclass(expected, Config):
        raise ValueError(f"{where}: expected a mapping with '{_TYPE_KEY}', got {type(value).__name__}")
    return value


# -- validation helpers (raise ValueError naming the field) ---------------------------------------


def coerce_enum(enum_cls: type[E], value: Any, field: str) -> E:
    """Accept an enum member or its value/name as a case-insensitive string."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        for member in enum_cls:
            if key in (str(member.value).lower(), member.name.lower()):
                return member
    allowed = ", ".join(str(m.value) for m in enum_cls)
    raise ValueError(f"{field}: expected one of {allowed}, got {value!r}")


def check_number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    return float(value)


def check_int(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if not (hasattr(value, "dtype") and value.dtype.kind in "iu"):
            raise ValueError(f"{field}: expected an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{field}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{field}: must be <= {maximum}, got {value}")
    return value


def check_positive(field: str, value: Any) -> float:
    v = check_number(field, value)
    if not v > 0:
        raise ValueError(f"{field}: must be > 0, got {value!r}")
    return v


def check_non_negative(field: str, value: Any) -> float:
    v = check_number(field, value)
    if v < 0:
        raise ValueError(f"{field}: must be >= 0, got {value!r}")
    return v


def check_range(
    field: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    v = check_number(field, value)
    ok_low = v >= low if low_inclusive else v > low
    ok_high = v <= high if high_inclusive else v < high
    if not (ok_low and ok_high):
        lo = "[" if low_inclusive else "("
        hi = "]" if high_inclusive else ")"
        raise ValueError(f"{field}: must be in {lo}{low}, {high}{hi}, got {value!r}")
    return v


__all__ = [
    "Config",
    "check_int",
    "check_non_negative",
    "check_number",
    "check_positive",
    "check_range",
    "coerce_enum",
]

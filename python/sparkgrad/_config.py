"""Configuration objects as data: dataclasses that validate on construction and round-trip through
JSON and YAML with equality preserved.

Every configuration class (layers, updaters, threshold algorithms, training masters, ...) is a
dataclass deriving from :class:`Config`. Serialised form: a mapping with the class's registered name
under ``"@type"`` and one key per dataclass field. Nested configs, lists/tuples of configs and enums
are handled recursively; tuples are restored as tuples. Unknown fields, a missing or foreign
``"@type"`` and values that fail the class's own validation raise ``ValueError`` naming the field.

Subclasses validate in ``__post_init__`` with the helpers below (``check_positive`` ...), so an
object built by hand and one read back from JSON go through exactly the same checks. The numeric
helpers accept only finite numbers (never bools), so ``inf``, ``nan`` or ``1e300`` in a config fail
where the config is built, naming the field, not later on an executor.

Text is untrusted input: YAML goes through a safe loader that refuses anchors and aliases (an alias
"bomb" of a few hundred bytes expands exponentially), and JSON, YAML and dict input may nest at most
``MAX_DEPTH`` levels (deeper input would exhaust the interpreter's recursion limit) and hold at most
``MAX_CONFIG_BYTES``; the nesting pre-scan of JSON is linear in the text's length. All raise
``ValueError`` naming the problem.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import re
from typing import Any, ClassVar, TypeVar

import yaml

C = TypeVar("C", bound="Config")
E = TypeVar("E", bound=enum.Enum)

_TYPE_KEY = "@type"
_TUPLE_KEY = "@tuple"

# Size limit of config text (JSON or YAML, in bytes or characters). A 1,000-layer network with an updater
# per layer is 0.4 MiB of indented JSON; the limit keeps parsing hostile text (a model file, the Spark ML
# networkConf param) to a fraction of a second.
MAX_CONFIG_BYTES = 4 << 20

# Nesting limit of mappings/lists in config text. Real configs nest about 6 levels (network ->
# layers -> layer -> updater/tuple); 64 leaves ample room and stays far below the recursion limit.
MAX_DEPTH = 64

# Upper bound of scale-like hyper-parameters (learning rates, epsilons, l1/l2/weight decay, encoding
# thresholds and clip multiples). They multiply float32 gradients, updates or residuals: a value past
# 1e6 drives float32 parameters (max 3.4e38) to inf within a few steps, so it is a typo or an overflow
# (1e300), never a setting; rejecting it where the config is built names the field.
MAX_SCALE = 1e6


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
    def from_json(cls: type[C], text: str | bytes) -> C:
        """Parse :meth:`to_json` output (nesting limited to ``MAX_DEPTH``; ValueError otherwise)."""
        return cls.from_dict(_load_json(text, f"{cls.__name__}.from_json"))

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_NoAliasDumper, sort_keys=False)

    @classmethod
    def from_yaml(cls: type[C], text: str | bytes) -> C:
        """Parse :meth:`to_yaml` output; anchors/aliases and nesting over ``MAX_DEPTH`` raise ValueError."""
        return cls.from_dict(_load_yaml(text, f"{cls.__name__}.from_yaml"))


# -- untrusted text ---------------------------------------------------------------------------------
# JSON strings (with escapes) are skipped so brackets inside them do not count toward the depth. The
# string pattern never backtracks (unrolled loop, optional closing quote: an unterminated string runs to
# the end of the text), so the scan is linear in the text's length.
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def _check_size(text: str | bytes | bytearray, where: str) -> None:
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{where}: {len(text)} bytes of configuration text exceed the limit of {MAX_CONFIG_BYTES}"
        )


def _load_json(text: str | bytes, where: str) -> Any:
    if isinstance(text, (str, bytes, bytearray)):
        _check_size(text, where)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON (not UTF-8: {exc})") from exc
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected JSON text, got {type(text).__name__}")
    # json's C scanner recurses per level and would raise RecursionError: measure the depth first.
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels (line {line})")
        elif token in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from exc


class _RefusedYAML(yaml.YAMLError):
    """Raised by :class:`_ConfigLoader` for input it refuses on purpose (not a syntax error)."""


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader without anchors/aliases and with a nesting limit (the composer recurses per level)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise _RefusedYAML(f"aliases are not allowed (line {line})")
        if event.anchor is not None:
            raise _RefusedYAML(f"anchors are not allowed (line {line})")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _RefusedYAML(f"nesting deeper than {MAX_DEPTH} levels (line {line})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that never writes anchors/aliases (the loader refuses them)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _load_yaml(text: str | bytes, where: str) -> Any:
    if not isinstance(text, (str, bytes, bytearray)):
        raise ValueError(f"{where}: expected YAML text, got {type(text).__name__}")
    _check_size(text, where)
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except _RefusedYAML as exc:
        raise ValueError(f"{where}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not valid YAML ({exc})") from exc


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


def _decode(value: Any, expected: type | None = None, where: str = "", depth: int = 0) -> Any:
    if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
        raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels")
    depth += 1
    if isinstance(value, dict) and _TYPE_KEY in value:
        return _decode_config(value, expected, where, depth)
    if isinstance(value, dict) and set(value) == {_TUPLE_KEY}:
        items = value[_TUPLE_KEY]
        if not isinstance(items, list):
            raise ValueError(f"{where}: '{_TUPLE_KEY}' must hold a list, got {type(items).__name__}")
        return tuple(_decode(v, where=where, depth=depth) for v in items)
    if isinstance(value, dict):
        return {k: _decode(v, where=f"{where}.{k}", depth=depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, where=where, depth=depth) for v in value]
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if expected is not None and issubclass(expected, Config):
        raise ValueError(f"{where}: expected a mapping with '{_TYPE_KEY}', got {type(value).__name__}")
    return value


def _decode_config(value: dict, expected: type | None, where: str, depth: int) -> Config:
    name = value[_TYPE_KEY]
    cls = Config._registry.get(name) if isinstance(name, str) else None
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
        kwargs[key] = _decode(raw, where=f"{name}.{key}", depth=depth)
    for key, f in fields.items():
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and key not in kwargs:
            raise ValueError(f"{name}: missing field {key!r}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a value of the wrong type tripping an operator in __post_init__
        raise ValueError(f"{name}: {exc}") from exc


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
    """A finite real number (not a bool) as float; ValueError naming ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    if not math.isfinite(v):
        raise ValueError(f"{field}: expected a finite number, got {value!r}")
    return v


def check_int(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (numpy integers too, never a bool) within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        if not (hasattr(value, "dtype") and value.dtype.kind in "iu"):
            raise ValueError(f"{field}: expected an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{field}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{field}: must be <= {maximum}, got {value}")
    return value


def check_positive(field: str, value: Any, maximum: float | None = None) -> float:
    """A finite number in (0, maximum] (no upper bound when ``maximum`` is None)."""
    v = check_number(field, value)
    if maximum is not None:
        return check_range(field, v, 0.0, maximum, low_inclusive=False)
    if not v > 0:
        raise ValueError(f"{field}: must be > 0, got {value!r}")
    return v


def check_non_negative(field: str, value: Any, maximum: float | None = None) -> float:
    """A finite number in [0, maximum] (no upper bound when ``maximum`` is None)."""
    v = check_number(field, value)
    if maximum is not None:
        return check_range(field, v, 0.0, maximum)
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
    """A finite number between ``low`` and ``high`` (each bound inclusive or not)."""
    v = check_number(field, value)
    ok_low = v >= low if low_inclusive else v > low
    ok_high = v <= high if high_inclusive else v < high
    if not (ok_low and ok_high):
        lo = "[" if low_inclusive else "("
        hi = "]" if high_inclusive else ")"
        raise ValueError(f"{field}: must be in {lo}{low:g}, {high:g}{hi}, got {value!r}")
    return v


__all__ = [
    "MAX_DEPTH",
    "MAX_SCALE",
    "Config",
    "check_int",
    "check_non_negative",
    "check_number",
    "check_positive",
    "check_range",
    "coerce_enum",
]

"""Strom (2015) threshold encoding of gradient updates, in Deeplearning4j's int32 message format, and the
gradient-sharing policy built on it. Every name is importable from here; the modules hold them by role:

- :mod:`sparkgrad.compress.codec`: the message format and the CPU/GPU codecs (encode, decode, header).
- :mod:`sparkgrad.compress.packing`: the packed wire form of a sparse message.
- :mod:`sparkgrad.compress.thresholds`: threshold algorithms and residual post-processors.
- :mod:`sparkgrad.compress.handler`: :class:`~sparkgrad.compress.handler.EncodingHandler`, a worker's
  residual and threshold state.
- :mod:`sparkgrad.compress.sharing`: the policy of SharedTrainingMaster's workers and ParallelWrapper's
  threads (how updates combine, what a worker applies of its own, the default threshold algorithm) and
  the steps a replica takes.
"""

from __future__ import annotations

from sparkgrad.compress.codec import (
    FLAG_BITMAP,
    FLAG_SPARSE,
    HEADER_WORDS,
    bitmap_decode,
    bitmap_encode,
    decode,
    decode_host_message,
    decode_message_into,
    message_indices,
    message_length,
    message_threshold,
    subtract_message,
    threshold_decode,
    threshold_encode,
    threshold_encode_into,
)
from sparkgrad.compress.handler import EncodingHandler
from sparkgrad.compress.packing import pack_message, unpack_message
from sparkgrad.compress.sharing import (
    DEFAULT_INITIAL_THRESHOLD,
    DEFAULT_OWN_UPDATE,
    DEFAULT_SPARSITY_TARGET,
    DEFAULT_UPDATE_COMBINATION,
    OWN_UPDATES,
    SUMMED_UPDATERS,
    UPDATE_COMBINATIONS,
    apply_message,
    check_own_update,
    default_threshold_algorithm,
    share_update,
    take_params,
    update_combination_for,
    update_scale,
)
from sparkgrad.compress.thresholds import (
    CATCH_UP_SPARSITY,
    DEFAULT_DECAY_RATE,
    MAX_SPARSITY,
    MAX_THRESHOLD,
    MIN_THRESHOLD,
    AdaptiveThresholdAlgorithm,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
    ResidualPostProcessor,
    TargetSparsityThresholdAlgorithm,
    ThresholdAlgorithm,
    ThresholdAlgorithmReducer,
)

__all__ = [
    "CATCH_UP_SPARSITY",
    "DEFAULT_DECAY_RATE",
    "DEFAULT_INITIAL_THRESHOLD",
    "DEFAULT_OWN_UPDATE",
    "DEFAULT_SPARSITY_TARGET",
    "DEFAULT_UPDATE_COMBINATION",
    "FLAG_BITMAP",
    "FLAG_SPARSE",
    "HEADER_WORDS",
    "MAX_SPARSITY",
    "MAX_THRESHOLD",
    "MIN_THRESHOLD",
    "OWN_UPDATES",
    "SUMMED_UPDATERS",
    "UPDATE_COMBINATIONS",
    "AdaptiveThresholdAlgorithm",
    "EncodingHandler",
    "FixedThresholdAlgorithm",
    "NoOpResidualPostProcessor",
    "ResidualClippingPostProcessor",
    "ResidualPostProcessor",
    "TargetSparsityThresholdAlgorithm",
    "ThresholdAlgorithm",
    "ThresholdAlgorithmReducer",
    "apply_message",
    "bitmap_decode",
    "bitmap_encode",
    "check_own_update",
    "decode",
    "decode_host_message",
    "decode_message_into",
    "default_threshold_algorithm",
    "message_indices",
    "message_length",
    "message_threshold",
    "pack_message",
    "share_update",
    "subtract_message",
    "take_params",
    "threshold_decode",
    "threshold_encode",
    "threshold_encode_into",
    "unpack_message",
    "update_combination_for",
    "update_scale",
]

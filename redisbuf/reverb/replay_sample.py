"""What a sample is (``reverb.replay_sample``): ``ReplaySample(info, data)`` with
``SampleInfo(key, probability, table_size, priority, times_sampled)``, numpy instead of
tensors."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class SampleInfo(NamedTuple):
    """What the table reports of a sampled item.

    Fields:
        key: the item's key (an int; ``np.uint64`` arrays in a dataset's batches), for
            ``mutate_priorities``.
        probability: the probability the draw had of selecting it.
        table_size: the table's number of items when it was sampled.
        priority: its priority when it was sampled.
        times_sampled: how many times it has been sampled, this time included.
    """

    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    @classmethod
    def tf_dtypes(cls) -> SampleInfo:
        """The dtypes of the fields (numpy's for TensorFlow's uint64, double, int64,
        double, int32)."""
        return cls(np.dtype(np.uint64), np.dtype(np.float64), np.dtype(np.int64),
                   np.dtype(np.float64), np.dtype(np.int32))

    @classmethod
    def tf_shapes(cls) -> SampleInfo:
        """The shapes of the fields: scalars."""
        return cls((), (), (), (), ())

    @classmethod
    def zeros(cls) -> SampleInfo:
        """A SampleInfo of Python zeros."""
        return cls(0, 0.0, 0, 0.0, 0)


class ReplaySample(NamedTuple):
    """A sample: its ``info`` (:class:`SampleInfo`) and its ``data`` (the trajectory,
    in the table's signature when unpacked, else its flat columns)."""

    info: SampleInfo
    data: Any


__all__ = ["ReplaySample", "SampleInfo"]

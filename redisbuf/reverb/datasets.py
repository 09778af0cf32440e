"""Reverb's datasets without TensorFlow: placeholder until written."""

from __future__ import annotations


class TrajectoryDataset:
    pass


class TimestepDataset:
    pass


class ReplayDataset:
    pass

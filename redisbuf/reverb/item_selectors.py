"""Reverb's selectors (``reverb.selectors``, ``reverb.item_selectors``): the ``sampler``
and ``remover`` of a :class:`~redisbuf.reverb.server.Table`."""

from __future__ import annotations

import functools

from . import pybind

Fifo = pybind.FifoSelector
Lifo = pybind.LifoSelector
MaxHeap = functools.partial(pybind.HeapSelector, False)
MinHeap = functools.partial(pybind.HeapSelector, True)
Prioritized = pybind.PrioritizedSelector
Uniform = pybind.UniformSelector

__all__ = ["Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Uniform"]

"""Samplers and selectors: which items a draw returns (the ``sampler=`` of a buffer).

A public namespace, as Reverb's ``reverb.selectors``: the classes live in
:mod:`redisbuf.sampling.samplers` and :mod:`redisbuf.sampling.selectors`; the
sampling guide (docs/sampling.md) says when to use which.
"""

from .sampling.samplers import PERSampler as PERSampler
from .sampling.samplers import PrioritizedSampler as PrioritizedSampler
from .sampling.samplers import UniformSampler as UniformSampler
from .sampling.selectors import FifoSampler as FifoSampler
from .sampling.selectors import LifoSampler as LifoSampler
from .sampling.selectors import MaxHeapSampler as MaxHeapSampler
from .sampling.selectors import MinHeapSampler as MinHeapSampler

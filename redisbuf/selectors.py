"""Samplers and selectors: which items a draw returns (the ``sampler=`` of a buffer),
and removers: which items leave a full buffer (its ``remover=``).

A public namespace, as Reverb's ``reverb.selectors``: the classes live in
:mod:`redisbuf.sampling.samplers`, :mod:`redisbuf.sampling.selectors` and
:mod:`redisbuf.sampling.removers`; the sampling guide (docs/sampling.md) says when to
use which.
"""

from .sampling.removers import FifoRemover as FifoRemover
from .sampling.removers import LifoRemover as LifoRemover
from .sampling.removers import MaxHeapRemover as MaxHeapRemover
from .sampling.removers import MinHeapRemover as MinHeapRemover
from .sampling.removers import PrioritizedRemover as PrioritizedRemover
from .sampling.removers import Remover as Remover
from .sampling.removers import UniformRemover as UniformRemover
from .sampling.samplers import PERSampler as PERSampler
from .sampling.samplers import PrioritizedSampler as PrioritizedSampler
from .sampling.samplers import UniformSampler as UniformSampler
from .sampling.selectors import FifoSampler as FifoSampler
from .sampling.selectors import LifoSampler as LifoSampler
from .sampling.selectors import MaxHeapSampler as MaxHeapSampler
from .sampling.selectors import MinHeapSampler as MinHeapSampler

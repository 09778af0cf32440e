"""Rate limiters: when an ``add`` or a ``sample`` may proceed (the ``rate_limiter=`` of a
buffer), enforced for every process that uses the buffer.

A public namespace, as Reverb's ``reverb.rate_limiters``: the classes live in
:mod:`redisbuf.sampling.limiters`.
"""

from .sampling.limiters import MinSize as MinSize
from .sampling.limiters import Queue as Queue
from .sampling.limiters import RateLimiter as RateLimiter
from .sampling.limiters import SampleToInsertRatio as SampleToInsertRatio
from .sampling.limiters import Stack as Stack

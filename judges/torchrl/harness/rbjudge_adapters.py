"""Adapters: redisbuf.torchrl's parts under TorchRL's constructor signatures.

TorchRL's tests build their parametrized parts as ``storage(size, compilable=...)``,
``writer(compilable=...)``, ``sampler()`` / ``PrioritizedSampler(max_capacity, alpha, beta)``.
These subclasses of redisbuf.torchrl's classes take those signatures and build the
redisbuf part (a RedisbufStorage on a fresh buffer name at $REDISBUF_URL). Keyword
arguments that only shape a TorchRL process-local layout are dropped (listed in DROPPED);
ones that have no redisbuf counterpart raise TypeError with a "[harness]" prefix.
The class names are redisbuf's, so test ids read e.g. ``...-RedisbufStorage-...``.
"""

from __future__ import annotations

import os
import uuid

from redisbuf.torchrl import PrioritizedReplayBuffer as _RBPRB
from redisbuf.torchrl import RedisbufPrioritizedSampler as _RBPS
from redisbuf.torchrl import RedisbufSampler as _RBS
from redisbuf.torchrl import RedisbufStorage as _RBStorage
from redisbuf.torchrl import RedisbufWriter as _RBW
from redisbuf.torchrl import TensorDictPrioritizedReplayBuffer as _RBTDPRB

DROPPED = {
    "storage": ("compilable", "consolidated", "shared_init", "cleanup_memmap",
                "scratch_dir", "existsok", "auto_cleanup"),
    "writer": ("compilable",),
    "prioritized_sampler": ("dtype", "device"),
}


def _url() -> str:
    url = os.environ.get("REDISBUF_URL")
    if not url:
        raise RuntimeError("[harness] REDISBUF_URL is not set (the plugin starts the server)")
    return url


class RedisbufStorage(_RBStorage):
    """``LazyTensorStorage(max_size, *, device, ndim, compilable, ...)`` -> RedisbufStorage."""

    def __init__(self, max_size=None, *, device="cpu", ndim=1, compilable=False,
                 consolidated=False, shared_init=False, cleanup_memmap=True,
                 scratch_dir=None, existsok=False, auto_cleanup=None):
        super().__init__(_url(), f"judge-{uuid.uuid4().hex[:12]}", max_size, device=device,
                         ndim=ndim)

    def __setstate__(self, state):
        # RedisbufStorage.__setstate__ calls type(self).__init__ with its own signature
        _RBStorage.__init__(self, state["url"], state["name"], state["max_size"],
                            seed=state["seed"], device=state["device"], ndim=state["ndim"],
                            **state["kwargs"])


class RedisbufWriter(_RBW):
    """``RoundRobinWriter(compilable=False, *, track_generations=False)`` -> RedisbufWriter."""

    def __init__(self, compilable=False, *, track_generations=False):
        if track_generations:
            raise TypeError("[harness] track_generations=True has no RedisbufWriter counterpart")
        super().__init__()


class RedisbufTDWriter(RedisbufWriter):
    """``TensorDictRoundRobinWriter(...)`` -> RedisbufWriter (named apart for test ids)."""


class RedisbufSampler(_RBS):
    """``RandomSampler()`` -> RedisbufSampler()."""

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"[harness] RandomSampler args {args} {kwargs} not mapped")
        super().__init__()


class RedisbufPrioritizedSampler(_RBPS):
    """``PrioritizedSampler(max_capacity, alpha, beta, eps, dtype, reduction,
    max_priority_within_buffer, device)`` -> RedisbufPrioritizedSampler."""

    def __init__(self, max_capacity=None, alpha=0.6, beta=0.4, eps=1e-8, dtype=None,
                 reduction="max", max_priority_within_buffer=False, device=None):
        if max_priority_within_buffer:
            raise TypeError("[harness] max_priority_within_buffer=True has no "
                            "RedisbufPrioritizedSampler counterpart")
        super().__init__(max_capacity, alpha, beta, eps, reduction)


# -- import redirect of the prioritized buffer classes ------------------------------------
# TorchRL's PrioritizedReplayBuffer / TensorDictPrioritizedReplayBuffer build TorchRL's
# PrioritizedSampler, which RedisbufStorage refuses; redisbuf.torchrl has its own classes of
# the same names. The tests key on these classes by identity (``rbtype is
# TensorDictPrioritizedReplayBuffer``), so in redisbuf mode the plugin rebinds the names in
# torchrl.data before the test modules import them: a TorchRL subclass that builds
# redisbuf's class when storage= is a RedisbufStorage, and TorchRL's otherwise.

from torchrl.data import PrioritizedReplayBuffer as TorchRLPrioritizedReplayBuffer  # noqa: E402
from torchrl.data import (  # noqa: E402
    TensorDictPrioritizedReplayBuffer as TorchRLTensorDictPrioritizedReplayBuffer,
)


class PrioritizedReplayBuffer(TorchRLPrioritizedReplayBuffer):
    def __new__(cls, *args, **kwargs):
        if isinstance(kwargs.get("storage"), _RBStorage):
            return _RBPRB(*args, **kwargs)
        return super().__new__(cls)


class TensorDictPrioritizedReplayBuffer(TorchRLTensorDictPrioritizedReplayBuffer):
    def __new__(cls, *args, **kwargs):
        if isinstance(kwargs.get("storage"), _RBStorage):
            return _RBTDPRB(*args, **kwargs)
        return super().__new__(cls)

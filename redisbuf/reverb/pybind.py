"""The names of Reverb's C++ bindings (``reverb.pybind``) that Python code reaches, in
plain Python: the selectors, the chunker options, and the sample's number of info fields.

No C++ runs here: a selector is the description of a redisbuf sampler or remover
(:mod:`redisbuf.reverb.tables` turns it into one), a chunker option the chunk length a
:class:`~redisbuf.buffers.step_writer.StepWriter` uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sampling.removers import priority_exponent_of


class ItemSelector:
    """The base of the selectors: how a table picks an item to sample or to remove."""

    kind = ""
    is_deterministic = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FifoSelector(ItemSelector):
    """The oldest item."""

    kind = "fifo"
    is_deterministic = True


class LifoSelector(ItemSelector):
    """The newest item."""

    kind = "lifo"
    is_deterministic = True


class UniformSelector(ItemSelector):
    """An item uniformly at random."""

    kind = "uniform"


class PrioritizedSelector(ItemSelector):
    """An item with probability ``priority^priority_exponent`` over the sum."""

    kind = "prioritized"

    def __init__(self, priority_exponent: float) -> None:
        value = priority_exponent_of(priority_exponent)
        self.priority_exponent = value

    def __repr__(self) -> str:
        return f"PrioritizedSelector(priority_exponent={self.priority_exponent})"


class HeapSelector(ItemSelector):
    """The item of lowest (``min_heap``) or highest priority."""

    kind = "heap"
    is_deterministic = True

    def __init__(self, min_heap: bool) -> None:
        self.min_heap = bool(min_heap)

    def __repr__(self) -> str:
        return f"HeapSelector(min_heap={self.min_heap})"


@dataclass(frozen=True)
class AutoTunedChunkerOptions:
    """Chunks as long as the writer's keep-alive window (redisbuf does not tune them)."""

    num_keep_alive_refs: int
    throughput_weight: float = 1.0


@dataclass(frozen=True)
class ConstantChunkerOptions:
    """Chunks of at most ``max_chunk_length`` steps."""

    max_chunk_length: int
    num_keep_alive_refs: int


class Sampler:
    """What Reverb's sampler binding tells Python: the info fields of a sample."""

    NUM_INFO_TENSORS = 5


__all__ = [
    "AutoTunedChunkerOptions", "ConstantChunkerOptions", "FifoSelector", "HeapSelector",
    "ItemSelector", "LifoSelector", "PrioritizedSelector", "Sampler", "UniformSelector",
]

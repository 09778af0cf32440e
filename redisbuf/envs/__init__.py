"""Small built-in environments used by the demo, the examples and the tests."""

from .hypergrid import HyperGrid

__all__ = ["HyperGrid"]

"""Reverb's Python API on redisbuf: change ``import reverb`` to ``from redisbuf import
reverb`` and keep your code.

Tables are shared redisbuf buffers on a Redis server (the embedded one a
:class:`Server` starts, or any at a URL), reached from every process by ``Client(
"host:port")``; their items reference steps stored once
(:mod:`redisbuf.buffers.steps`). No TensorFlow and no C++ extension: numpy in and out,
``tf.TensorSpec`` signatures when TensorFlow happens to be installed, or
:class:`TensorSpec`. The submodules are Reverb's: ``client``, ``server``, ``errors``,
``item_selectors`` (``selectors``), ``rate_limiters``, ``trajectory_writer``,
``structured_writer`` (``structured``), ``replay_sample``, ``reverb_types``,
``checkpointers``, ``pybind`` (the names Python reaches of Reverb's bindings), and the
datasets (:mod:`redisbuf.reverb.datasets`). docs/coming-from/reverb.md lists every
difference.
"""

from __future__ import annotations

from . import checkpointers as checkpointers
from . import client as client
from . import errors as errors
from . import item_selectors as item_selectors
from . import item_selectors as selectors
from . import pybind as pybind
from . import rate_limiters as rate_limiters
from . import replay_sample as replay_sample
from . import reverb_types as reverb_types
from . import server as server
from . import structured_writer as structured
from . import structured_writer as structured_writer
from . import trajectory_writer as trajectory_writer
from .client import Client as Client
from .client import Writer as Writer
from .datasets import ReplayDataset as ReplayDataset
from .datasets import TimestepDataset as TimestepDataset
from .datasets import TrajectoryDataset as TrajectoryDataset
from .errors import DeadlineExceededError as DeadlineExceededError
from .errors import ReverbError as ReverbError
from .replay_sample import ReplaySample as ReplaySample
from .replay_sample import SampleInfo as SampleInfo
from .server import Server as Server
from .server import Table as Table
from .structured_writer import StructuredWriter as StructuredWriter
from .tensor_spec import TensorSpec as TensorSpec
from .trajectory_writer import TrajectoryColumn as TrajectoryColumn
from .trajectory_writer import TrajectoryWriter as TrajectoryWriter

__all__ = [
    "Client", "DeadlineExceededError", "ReplayDataset", "ReplaySample", "ReverbError",
    "SampleInfo", "Server", "StructuredWriter", "Table", "TensorSpec", "TimestepDataset",
    "TrajectoryColumn", "TrajectoryDataset", "TrajectoryWriter", "Writer",
    "checkpointers", "client", "errors", "item_selectors", "pybind", "rate_limiters",
    "replay_sample", "reverb_types", "selectors", "server", "structured",
    "structured_writer", "trajectory_writer",
]

"""The control plane between training workers and the replay-buffer manager.

One protocol (:mod:`.protocol`), two backends: MPI (:mod:`.mpi`, for ranks started by
``mpiexec``) and Redis (:mod:`.redis`, for any processes that reach the same server).
The backends are imported on demand: importing mpi4py initializes MPI.
"""

from .protocol import ANY_SOURCE, DATA_TAG, METADATA_TAG, Transport

__all__ = ["ANY_SOURCE", "DATA_TAG", "METADATA_TAG", "Transport"]

"""Runnable examples, e.g. ``mpiexec -n 5 python -m redisbuf.examples.mpi_hypergrid``."""

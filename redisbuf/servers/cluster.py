"""A Redis Cluster of a few masters on loopback, for tests, benchmarks and trying things.

Each master is an :class:`~redisbuf.servers.embedded.EmbeddedServer` started with
``--cluster-enabled yes`` in its own temporary directory (its ``nodes.conf``). The slots
are split into equal contiguous ranges (master ``i`` gets the ``i``-th) with
``CLUSTER ADDSLOTSRANGE``, the nodes meet with ``CLUSTER MEET``, all through redis-py: no
``redis-cli`` is needed. ``cluster-require-full-coverage`` is ``no``, so that when one
master stops the others keep serving their slots.
"""

from __future__ import annotations

import random
import socket
import time
from types import TracebackType

import redis

from ..errors import ServerUnavailableError
from .embedded import EmbeddedServer

SLOTS = 16384
# A node also listens on port + 10000 (the cluster bus), which must be a valid port.
_MAX_PORT = 55535


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(rng: random.Random | None = None) -> int:
    """A port whose bus port (port + 10000) is also free, below the ephemeral range."""
    rng = rng or random.Random()
    for _attempt in range(200):
        port = rng.randrange(20000, 30000)
        if _port_free(port) and _port_free(port + 10000) and port <= _MAX_PORT:
            return port
    raise ServerUnavailableError("no free pair of loopback ports for a cluster node")


class LocalCluster:
    """``masters`` cluster masters on 127.0.0.1, started by :meth:`start` (or ``with``).

    ``urls`` are the nodes' ``redis://`` URLs; :meth:`stop_master` stops one of them (its
    slots stay unserved) to try failures.

    Args:
        masters: the number of masters (>= 1).
        node_timeout_ms: the nodes' ``cluster-node-timeout``.
        startup_timeout: seconds :meth:`start` waits for ``cluster_state:ok``.

    Raises:
        ValueError: ``masters < 1``.

    Examples:
        Skipped by the doctest run, which starts no process (tests/test_cluster.py does):

        >>> import redis.cluster
        >>> from redisbuf import LocalCluster
        >>> with LocalCluster(masters=3) as cluster:  # doctest: +SKIP
        ...     client = redis.cluster.RedisCluster.from_url(cluster.urls[0])
        ...     len(client.get_primaries())
        3
    """

    def __init__(
        self, masters: int = 3, node_timeout_ms: int = 2000, startup_timeout: float = 30.0
    ) -> None:
        if masters < 1:
            raise ValueError(f"masters must be >= 1, got {masters}")
        self.masters = masters
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        self.servers: list[EmbeddedServer] = []

    @property
    def urls(self) -> list[str]:
        """The masters' ``redis://127.0.0.1:PORT`` URLs, in start order."""
        return [f"redis://127.0.0.1:{server.port}" for server in self.servers]

    @property
    def ports(self) -> list[int]:
        """The masters' ports, in start order."""
        return [server.port for server in self.servers]

    def start(self) -> LocalCluster:
        """Start the masters, assign the slots, and wait for ``cluster_state:ok`` on every
        node (and for every node to know every other's slots).

        Returns:
            This cluster.

        Raises:
            ServerUnavailableError: a master did not start, or the cluster did not reach
                ``cluster_state:ok`` within ``startup_timeout`` seconds (every master is
                stopped then).
        """
        try:
            for _ in range(self.masters):
                server = EmbeddedServer(
                    port=cluster_port(),
                    extra_args=[
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", str(self.node_timeout_ms),
                        "--cluster-require-full-coverage", "no",
                    ],
                )
                self.servers.append(server.start())
            clients = [redis.Redis(host="127.0.0.1", port=p) for p in self.ports]
            for index, client in enumerate(clients):
                first = index * SLOTS // self.masters
                last = (index + 1) * SLOTS // self.masters - 1
                client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
            for client in clients[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
            self._wait_ok(clients)
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self, clients: list[redis.Redis]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            ready = True
            for client in clients:
                info = client.execute_command("CLUSTER INFO")  # redis-py parses it
                if info.get("cluster_state") != "ok" or int(
                    info.get("cluster_known_nodes", 0)
                ) != len(clients):
                    ready = False
                    break
                slots = client.execute_command("CLUSTER SLOTS")
                if sum(int(row[1]) - int(row[0]) + 1 for row in slots) != SLOTS:
                    ready = False
                    break
            if ready:
                return
            if time.monotonic() > deadline:
                raise ServerUnavailableError(
                    f"the local cluster on ports {self.ports} did not reach cluster_state:ok "
                    f"within {self.startup_timeout:.0f} s"
                )
            time.sleep(0.05)

    def stop_master(self, index: int) -> None:
        """Stop master ``index`` (its slots stay unserved; the others keep theirs).

        Args:
            index: the master's index in :attr:`servers`.
        """
        self.servers[index].stop()

    def stop(self) -> None:
        """Stop every master; idempotent."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

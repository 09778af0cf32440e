"""How a :class:`~redisbuf.buffers.sharded.ShardedReplayBuffer` draws: the batch laws.

A sharded buffer draws a batch in one of two laws, chosen by its ``batch_law``:

* ``"global"`` (the default): the batch has the distribution of an unsharded
  :meth:`~redisbuf.ReplayBuffer.sample` over every shard's items. Uniform draws choose how
  many items each shard gives (multinomial over the shards' sizes with replacement,
  multivariate hypergeometric without), draw within the shards, then shuffle; prioritized
  and PER draws with replacement choose the counts by multinomial over the shards' total
  masses (corrected to the masses at the commits, see ``_draw_per``); prioritized
  draws without replacement draw a successive sequence of ``min(n,
  drawable items)`` from every shard and replay the global successive draw over them,
  by the shards' masses at those commits (torch.multinomial's distribution, at the cost
  of reading up to ``N`` times ``n`` items; the items the replay did not use are taken
  back). Every shard that gives items is asked, at
  once (one thread each); a draw that fails on one shard takes back the parts the others
  committed.

  Uniform draws of at most ``MAX_ITEMS_PER_COMMAND`` items skip the round trip that asks
  every shard's size: the counts are chosen from the sizes the shards reported at the
  previous draw, and the draw stands only if every shard reports that same size (a shard
  that gives nothing is asked its size at the same time); else it is taken back and made
  again from sizes asked now, and the next ``2^k - 1`` draws (``k`` misses in a row, at
  most 63) ask the sizes first. Whether it stands depends on the sizes alone, never on
  the items drawn, so a draw that stands has the law of the sizes at the draw.

* ``"shard_local"``: each batch comes whole from ONE shard, chosen with probability its
  mass over the buffer's (its size for uniform draws, its total softmax or PER mass for
  prioritized ones), and is that shard's own draw of ``n``. Every single draw therefore
  has the global law (item ``i`` of shard ``k``: ``mass_k / total * mass_i / mass_k``);
  only the joint law of a batch differs (its items share a shard). Uniform without
  replacement: a uniform ``n``-subset of the chosen shard, or, when ``n`` exceeds that
  shard's size, a draw with replacement there (the unsharded rule); each position stays
  uniform over the whole buffer, and when every shard holds at least ``n`` items every
  item's chance to be in a batch is ``n / len`` as in the global law. Once the buffer
  was at least half full at the last look, the shard is chosen without asking every
  shard's size (:meth:`ShardedSampling._draw_one_by_rejection`). Prioritized (softmax)
  without replacement: the chosen shard's successive draws (the first item's law is the
  global one at the commit, the later ones' the shard's successive law, reported as the
  shard's share times the shard's probability); when a shard of nonzero mass holds fewer drawable
  items than ``n``, that batch is drawn by the global law (a choice made on the masses
  alone). Only the chosen shard draws, which is why the server cost per drawn item
  falls as shards are added.

In both laws, a prioritized draw reads every shard's masses from this process's
replicas, caught up in one request to every shard at once (on a cluster, every master
through its shard's own client): right after the commits (``_rounds``; without
replacement in the global law, also when the sample begins, to know which shards to
ask); each drawn item's reported
probability is its mass over the whole buffer's; PER ``weights`` are ``(lowest mass of
the whole buffer / mass)^beta`` and ``importance_weights`` the item's priority over the
mean non-zero priority of the whole buffer (the drawn shards' sums as their commits
report them, the other shards' from the replicas).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import redis

from ..errors import DecodeError, EmptyBufferError, SamplingError, WaitTimeoutError
from ..sampling import commits
from ..sampling.replica import MassReplica, replica_of
from ..sampling.samplers import Draw
from ..store import applying, bounds, scripts
from ..store.connection import is_cluster
from . import quarantine
from .replay import ReplayBuffer, SampleInfo
from .shard_calls import ShardCalls

if TYPE_CHECKING:
    from ..sampling.samplers import PERSampler

#: the batch laws a sharded buffer draws by (see the module docstring)
BATCH_LAWS = ("global", "shard_local")
# Prioritized draws taken back because a shard's total moved before its commit are drawn
# again, at most this many rounds in all (each takes back a fraction ~|T' - T| / T of them)
_ROUNDS = 64

# (global ids, blobs, probabilities or None, (shard, schema_json) to decode by)
Drawn = tuple[list[int], list[bytes], Any, Any]


def _head(replica: MassReplica | None) -> tuple[str, int, str]:
    """A replica's (epoch, version, stamp), read under its lock; a first read's for none."""
    if replica is None:
        return ("", 0, "")
    with replica.lock:
        return (replica.epoch, replica.version, replica.stamp)

class ShardedSampling(ShardCalls):
    """Sampling of :class:`~redisbuf.buffers.sharded.ShardedReplayBuffer` (a mixin: the
    buffer provides ``client``, ``name``, ``count``, ``shards``, ``rng``, ``per``,
    ``prioritized_sampling``, ``batch_law``, ``parallel`` and ``_on_shard``)."""

    if TYPE_CHECKING:
        client: Any
        name: str
        count: int

        def __len__(self) -> int: ...
        shards: list[ReplayBuffer]
        rng: np.random.Generator
        per: PERSampler | None
        prioritized_sampling: bool
        batch_law: str
        parallel: bool
        _last_weights: tuple[np.ndarray, np.ndarray]
        #: (shard sizes the last uniform draws reported, misses in a row, draws to skip)
        _known: tuple[np.ndarray | None, int, int]
        capacity: int
        #: each shard's fill (items over the largest shard capacity) as last seen
        _fill: np.ndarray

        def _on_shard(self, k: int) -> Any: ...

    # -- the shards' state --------------------------------------------------------------

    def _replicas(self, rule: str, current: Collection[int] = ()) -> list[MassReplica]:
        """Every shard's replica for ``rule``, caught up now (one pipeline over the
        shards): the shards' masses as of this call, and draws from them that follow
        every change made before it. The shards ``current`` are not asked: their replicas
        are as their commits of this call left them (a commit catches its replica up)."""
        script = scripts.load("masslog_read")
        replicas = [shard.view.replicas.get(rule) for shard in self.shards]
        asked = [k for k in range(self.count) if k not in current or replicas[k] is None]
        # each replica's position read under its lock: another thread's update_priority
        # moves it (version, then stamp) and a torn one reads as another history
        heads = [_head(replica) for replica in replicas]

        def command(pipe: Any, shard: ReplayBuffer) -> None:
            keys = shard.keys.all_keys()
            scripts.queue(pipe, self.client, script, keys,
                          list(heads[self.shards.index(shard)]))

        def read(k: int) -> Any:
            shard = self.shards[k]
            with self._on_shard(k):
                return shard._run("masslog_read", shard.keys.all_keys(), list(heads[k]))

        if is_cluster(self.client):
            # each shard's master through its own client, at once: a cluster pipeline
            # would first ask a node for the keys of every EVALSHA (COMMAND GETKEYS)
            replies = list(self._in_parallel({k: (read, (k,)) for k in asked}).values())
        else:
            replies = self._per_shard(command, asked)
            if any(scripts.missing(r) for r in replies):
                scripts.reload(self.client, script)  # every master
                replies = self._per_shard(command, asked)
            if any(isinstance(r, scripts._REFUSED_WRITES) for r in replies):
                # a server refusing writes (maxmemory) refuses a function not flagged
                # read-only before it runs: each shard through the runner, which falls
                # back to the read-only variant
                replies = [read(k) for k in asked]
        by_shard = dict(zip(asked, replies, strict=True))
        out = []
        for k, shard in enumerate(self.shards):
            if k not in by_shard:
                out.append(cast("MassReplica", replicas[k]))  # current (not None: asked)
                continue
            reply = by_shard[k]
            if applying.refused(reply):
                reply = read(k)  # through the runner, which stores the large add first
            if isinstance(reply, redis.exceptions.ResponseError):
                raise scripts.translate(reply)
            if isinstance(reply, Exception):
                raise reply
            with self._on_shard(k):
                if int(reply[0]) == 2:  # not on in this shard (made again): turn it on
                    shard.sampler.prepare(shard.view)
                    replicas[k] = None
                held = replicas[k]
                if held is None:
                    replica = replica_of(shard.view, rule)  # reads the shard
                else:
                    replica = held
                    with replica.lock:
                        if _head(replica) == heads[k]:
                            replica.catch_up(shard.view, reply)
                        else:  # moved since (an update of this process): on from there
                            replica.sync(shard.view)
            out.append(replica)
        return out

    def _masses(self, rule: str = "softmax") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sizes, drawable counts, log masses) of the shards, for prioritized draws, from
        their replicas (caught up now)."""
        replicas = self._replicas(rule)
        sizes = np.array([len(r) for r in replicas], dtype=np.int64)
        drawable = np.array([r.positive for r in replicas], dtype=np.int64)
        return sizes, drawable, self._log_masses(replicas)

    # -- drawing ------------------------------------------------------------------------

    def _shard_draw(self, k: int, n: int, replacement: bool) -> Draw:
        with self._on_shard(k):
            return self.shards[k]._draw(n, replacement)

    def _draw(self, n: int, replacement: bool | None) -> Drawn:
        """(global ids, blobs, probabilities or None, (shard, schema_json) to decode by)
        of a batch of ``n`` by the buffer's ``batch_law``."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        n = int(n)
        local = self.batch_law == "shard_local"
        if self.per is not None:
            return self._draw_per(n, local)
        if self.prioritized_sampling:
            return self._draw_prioritized(n, bool(replacement), local)
        return self._draw_uniform(n, replacement, local)

    def _draw_uniform(self, n: int, replacement: bool | None, local: bool) -> Drawn:
        if not local and n <= bounds.MAX_ITEMS_PER_COMMAND:
            known, misses, skip = self._known
            if skip > 0:
                self._known = (known, misses, skip - 1)
            elif known is not None and (known >= 0).all():
                drawn = self._draw_uniform_on(known, n, replacement, check=True)
                if drawn is not None:
                    self._known = (self._known[0], 0, 0)
                    return drawn
                # the sizes moved (a filling buffer): ask them first for a while
                misses += 1
                self._known = (self._known[0], misses, min(2**misses, 64) - 1)
        if local and n <= bounds.MAX_ITEMS_PER_COMMAND and self._fill.mean() >= 0.5:
            drawn = self._draw_one_by_rejection(n, replacement)
            if drawn is not None:
                return drawn
        sizes = self._sizes()
        if local:
            total = int(sizes.sum())
            self._fill = sizes / -(-self.capacity // self.count)
            if total == 0:
                raise EmptyBufferError(f"buffer {self.name!r}: buffer is empty")
            k = self._choose(sizes)
            # n above the shard's size: with replacement there, as a buffer of that size
            draw = self._shard_draw(k, n, bool(replacement) or n > total)
            return [i * self.count + k for i in draw.ids], draw.blobs, None, (
                k, draw.schema_json)
        drawn = self._draw_uniform_on(sizes, n, replacement, check=False)
        assert drawn is not None  # only a checked draw is refused
        return drawn

    def _draw_one_by_rejection(self, n: int, replacement: bool | None) -> Drawn | None:
        """A shard-local uniform batch without asking every shard's size: a shard chosen
        uniformly draws the batch, which stands with probability its size (as its script
        reported it) over the largest shard capacity, else is taken back and another
        shard chosen. Each try that stands picks shard ``k`` with probability
        proportional to its size at that try, so every item's chance is the same; a try
        does not depend on the earlier ones, so whatever the number of tries the batch
        that stands has that law. None (nothing recorded) after a few refused tries."""
        bound = -(-self.capacity // self.count)  # the largest shard's capacity
        for _ in range(4):
            k = int(self.rng.integers(self.count))
            try:
                draw = self._shard_draw(k, n, bool(replacement))
            except EmptyBufferError:
                self._fill[k] = 0.0
                continue  # size 0: taken with probability 0
            seen = self.shards[k].view.id_range
            if seen is None:  # its size unknown: ask every shard's
                self._undo({k: draw})
                return None
            size = min(int(seen.length), bound)  # a shard never holds more
            self._fill[k] = size / bound
            if self.rng.random() * bound < size:
                return [i * self.count + k for i in draw.ids], draw.blobs, None, (
                    k, draw.schema_json)
            self._undo({k: draw})
        return None

    def _draw_uniform_on(
        self, sizes: np.ndarray, n: int, replacement: bool | None, check: bool
    ) -> Drawn | None:
        """The global uniform draw for shard sizes ``sizes``; with ``check``, None (and
        nothing recorded) unless every shard is asked and reports exactly those sizes."""
        total = int(sizes.sum())
        if total == 0:
            if check:
                return None
            raise EmptyBufferError(f"buffer {self.name!r}: buffer is empty")
        replace = bool(replacement) or n > total
        if replace:
            counts = self.rng.multinomial(n, sizes / total)
        else:
            counts = self.rng.multivariate_hypergeometric(sizes, n)
        wanted = {k: (c, replace) for k, c in enumerate(counts.tolist()) if c}
        if check:
            # a shard that gives nothing is asked its size, so that whether the draw
            # stands depends on every shard's size and on nothing drawn
            calls = {k: (self._shard_draw, (k, int(c), replace)) if c
                     else (self._shard_size, (k,)) for k, c in enumerate(counts.tolist())}
            try:
                replies = self._all_or_none(calls)
            except (EmptyBufferError, SamplingError):
                self._known = (None, *self._known[1:])
                return None
            draws = {k: r for k, r in replies.items() if isinstance(r, Draw)}
            reported = self._reported(draws, sizes)
            for k, reply in replies.items():
                if not isinstance(reply, Draw):
                    reported[k] = reply
            self._known = (reported, *self._known[1:])
            if not np.array_equal(reported, sizes):
                self._undo(draws)
                return None
        else:
            draws = self._draws(wanted)
            if n <= bounds.MAX_ITEMS_PER_COMMAND:
                self._known = (self._reported(draws, sizes), *self._known[1:])
        ids: list[int] = []
        blobs: list[bytes] = []
        source = None
        for k, draw in draws.items():
            ids += [i * self.count + k for i in draw.ids]
            blobs += list(draw.blobs)
            source = source or (k, draw.schema_json)
        order = self.rng.permutation(len(ids))  # a shard's draws are not a block
        return [ids[i] for i in order], [blobs[i] for i in order], None, source

    def _shard_size(self, k: int) -> int:
        with self._on_shard(k):
            return int(self.shards[k].client.zcard(self.shards[k].keys.order))

    def _reported(self, draws: dict[int, Draw], sizes: np.ndarray) -> np.ndarray:
        """The shards' sizes as the scripts of ``draws`` reported them (each asked
        shard's uniform draw notes its length), ``sizes`` for the others."""
        out = sizes.copy()
        for k in draws:
            seen = self.shards[k].view.id_range
            out[k] = -1 if seen is None else seen.length
        return out

    def _choose(self, mass: np.ndarray) -> int:
        """A shard with probability its share of ``mass`` (shard-local batches)."""
        return int(self.rng.choice(self.count, p=mass / mass.sum()))

    def _draws(self, wanted: dict[int, tuple[int, bool]]) -> dict[int, Draw]:
        """Shard ``k``'s draw of ``wanted[k] = (n, replacement)`` for each ``k``, the
        shards asked at once (one thread each: their round trips overlap); when one
        fails, the others' are taken back (:meth:`_all_or_none`)."""
        return self._all_or_none({k: (self._shard_draw, (k, n, r))
                                  for k, (n, r) in wanted.items()})

    def _draw_prioritized(self, n: int, replacement: bool, local: bool) -> Drawn:
        if not replacement:
            log_mass, drawable = self._masses_to_draw(n)
        if replacement or log_mass is None:  # (None: more draws than items) with
            # replacement, the shards' shares corrected to their masses at the commits
            return self._assembled(*self._rounds(n, local, "softmax", self._shard_draw)[::2])
        if local and not (np.isfinite(log_mass) & (drawable < n)).any():
            # one shard's successive draws, its share corrected to the masses at the commit
            pieces, _, rounds = self._rounds(n, True, "softmax", self._shard_draw, False)
            return self._assembled(pieces, rounds, shuffle=False)
        sequences, levels = self._successive_sequences(n, log_mass, drawable)
        try:
            drawn = self._replayed(n, sequences, levels)
        except BaseException:
            self._undo(sequences)  # a failed sample records nothing
            raise
        # each shard's items after those the replay used were committed but are not
        # returned: taken back, so counts and use counts are those of the batch (a
        # sharded buffer has no max_use, so no committed draw removed its item)
        used = np.bincount(np.asarray(drawn[0]) % self.count, minlength=self.count)
        self._take_back({k: draw.ids[used[k]:] for k, draw in sequences.items()})
        return drawn

    def _replayed(self, n: int, sequences: dict[int, Draw],
                  levels: dict[int, np.ndarray]) -> Drawn:
        """The global successive draw of ``n`` replayed over the shards' sequences: each
        step takes a shard with probability its remaining mass over the total, then that
        shard's next item. ``levels[k][j]`` is the log of shard ``k``'s remaining mass
        before its ``j``-th item (see :meth:`_successive_sequences`); the shares are
        taken relative to the largest, so masses e^-745 below the rest (which a double
        holds as 0) keep their share."""
        taken = dict.fromkeys(sequences, 0)
        ids, blobs, out = [], [], []
        for _ in range(n):
            level = np.full(self.count, -math.inf)
            for k, j in taken.items():
                if j < len(levels[k]):
                    level[k] = levels[k][j]
            share = np.exp(level - level.max())
            share /= share.sum()
            k = int(self.rng.choice(self.count, p=share))
            draw, j = sequences[k], taken[k]
            out.append(float(draw.probabilities[j]) * share[k])  # type: ignore[index]
            taken[k] = j + 1
            ids.append(draw.ids[j] * self.count + k)
            blobs.append(draw.blobs[j])
        first = next(iter(sequences))
        return ids, blobs, np.array(out), (first, sequences[first].schema_json)

    def _masses_to_draw(self, n: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The shards' log masses (-inf: none) for ``n`` draws without replacement, None
        when ``n`` exceeds the items (drawn with replacement then), and their drawable
        counts, from the replicas caught up now."""
        sizes, drawable, log_mass = self._masses()
        if int(sizes.sum()) == 0 or not np.isfinite(log_mass).any():
            raise EmptyBufferError(
                f"buffer {self.name!r}: buffer is empty (no item with a finite log-reward)")
        if n > int(sizes.sum()):
            return None, drawable
        if n > int(drawable.sum()):
            raise SamplingError(f"buffer {self.name!r}: {n} draws without replacement but "
                                f"only {int(drawable.sum())} items have nonzero probability")
        return log_mass, drawable

    def _successive_sequences(
        self, n: int, log_mass: np.ndarray, drawable: np.ndarray
    ) -> tuple[dict[int, Draw], dict[int, np.ndarray]]:
        """Every shard's own successive draw of ``min(n, its drawable items)``, committed
        there, and for each the log of the shard's remaining mass before each of its
        items at that commit: ``log_reward_j - log p_j``, ``p_j`` the item's successive
        probability in the shard (its mass over the mass left), which stays exact where
        the mass left after an item is below a double's precision beside it. The global
        successive draw replayed over the sequences then has the law of the buffer at the
        commits, whatever changed since ``log_mass`` (the masses the shards were chosen
        from) was read. The draws are taken back and made again when a shard not asked
        holds mass at the commits, or one asked holds more drawable items than it gave and
        fewer than ``n``, or the sequences hold fewer than ``n`` items."""
        for _ in range(_ROUNDS):
            asked = [k for k in range(self.count)
                     if np.isfinite(log_mass[k]) and drawable[k] > 0]
            emptied: EmptyBufferError | None = None
            sequences: dict[int, Draw] | None
            try:
                sequences = self._draws({k: (min(n, int(drawable[k])), False) for k in asked})
            except EmptyBufferError as exc:  # a shard emptied since the masses were read
                sequences, emptied = None, exc  # (the others' taken back): read them again
            if sequences is not None:
                try:  # the shards asked are current: their commits caught them up
                    levels = {k: self._levels(k, draw) for k, draw in sequences.items()}
                    replicas = (self._replicas("softmax", current=sequences)
                                if len(sequences) < self.count
                                else [shard.view.replicas["softmax"] for shard in self.shards])
                    after = self._log_masses(replicas)
                except BaseException:
                    self._undo(sequences)
                    raise
                # a shard that lost items since its masses were read draws with
                # replacement (n above its length): its sequence repeats, so draw again
                short = [k for k, draw in sequences.items()
                         if len(draw.ids) < n and replicas[k].positive > len(draw.ids)
                         or len(set(np.asarray(draw.ids).tolist())) < len(draw.ids)]
                unasked = [k for k in range(self.count) if k not in sequences]
                if not short and not np.isfinite(after[unasked]).any() \
                        and np.isfinite(after[list(sequences)]).all() \
                        and sum(len(draw.ids) for draw in sequences.values()) >= n:
                    return sequences, levels
                self._undo(sequences)
            again, drawable = self._masses_to_draw(n)
            if again is None:  # items went meanwhile: fewer than n are left
                break
            if emptied is not None and np.isfinite(again[asked]).all():
                raise emptied  # every shard asked holds mass: not an emptied shard
            log_mass = again
        raise SamplingError(
            f"buffer {self.name!r}: the shards' total masses kept changing between the "
            f"choice of shards and their commits ({_ROUNDS} rounds)")

    def _levels(self, k: int, draw: Draw) -> np.ndarray:
        """The log of shard ``k``'s remaining mass before each item of its successive
        ``draw``, just committed (so its replica holds the scores of the commit)."""
        replica = self.shards[k].view.replicas["softmax"]
        with replica.lock:
            slots = replica.slots_of(np.asarray(draw.ids, dtype=np.int64))
            if (slots < 0).any():
                raise SamplingError(f"buffer {self.name!r}: shard {k}'s replica lacks an "
                                    "item its commit drew")
            log_rewards = replica.scores[slots]
        with np.errstate(divide="ignore"):
            return log_rewards - np.log(np.asarray(draw.probabilities, dtype=float))

    def _draw_per(self, n: int, local: bool) -> Drawn:
        """PER with replacement: item ``i`` with probability ``mass_i / sum of all
        masses``. Global: the counts per shard by multinomial over the shards' total
        masses, then each shard's draw, committed by that shard. Shard-local: one shard
        by its total mass, all ``n`` drawn and committed there.

        A shard's commit corrects its draws to the shard's law at the commit, but the
        shards were chosen from their totals before (``T``, the replicas as this process
        last caught them up). So once the drawn shards have committed, the others'
        replicas catch up too (one request to every shard at once), giving every shard's
        total ``T'`` at about the commits; a draw from shard
        ``k`` stands with probability ``(T'_k / T_k) / r``, ``r`` the largest such ratio
        over the shards (rejection from the law of ``T`` to that of ``T'``), and the
        others are taken back and drawn again from ``T'``. A draw that stands thus
        follows the law of the buffer at its commit. With ``max_use`` a draw may have
        removed its item at the commit, which cannot be taken back: there every draw
        stands (the law of ``T`` for the shard, of the commit within it)."""
        assert self.per is not None
        pieces, replicas, rounds = self._rounds(n, local, "per", self._per_commit)
        ids, blobs, probability, source = self._assembled(pieces, rounds, shuffle=False)
        last = {k: draw for k, draw, _, _ in pieces}  # each shard's latest commit
        mass = np.concatenate([draw.masses[kept] for _, draw, kept, _ in pieces])
        priority = np.concatenate([draw.scores[kept] for _, draw, kept, _ in pieces])
        min_mass = min(r.min_mass for r in replicas)
        # the whole buffer's mean non-zero priority: a drawn shard's sums as its commit
        # reports them (as an unsharded buffer's), the others' from their replicas
        per_sum, nonzero = 0.0, 0
        for k, replica in enumerate(replicas):
            if k in last:
                per_sum += last[k].per_sum
                nonzero += last[k].per_nonzero
            else:
                with replica.lock:
                    per_sum += replica.score_sum
                    nonzero += replica.nonzero
        mean = per_sum / nonzero if nonzero else 0.0
        weights = ((min_mass / mass) ** self.per.beta,
                   priority / mean if mean > 0 else np.ones(n))
        if len(pieces) == 1:  # one shard's draw is already in random order
            self._last_weights = weights
            return ids, blobs, probability, source
        order = self.rng.permutation(len(ids))
        self._last_weights = (weights[0][order], weights[1][order])
        return [ids[i] for i in order], [blobs[i] for i in order], probability[order], source

    def _rounds(
        self, n: int, local: bool, rule: str, commit: Any, replacement: bool = True
    ) -> tuple[list[tuple[int, Any, np.ndarray, float]], list[MassReplica], int]:
        """``n`` draws with replacement by ``rule``'s masses, each committed by its shard
        (``commit(k, count, replacement)``), whose shares follow the shards' masses at the
        commits (see :meth:`_draw_per`). Returns the pieces ``(shard, its draw, the
        positions that stand, the shard's share of the mass at the commits)``, the
        replicas and the number of rounds. Without replacement only one shard draws
        (``local``): its batch stands or is taken back whole.

        The shares are chosen from the replicas as this process holds them (caught up at
        its last draw): any masses serve as the proposal of the rejection, which only
        needs those at the commits; so each draw costs one request to every shard, after
        the commits, and none before (a replica not read yet is read first)."""
        inline = any(shard.view.fetch_inline for shard in self.shards)
        held = [shard.view.replicas.get(rule) for shard in self.shards]
        if inline or any(replica is None for replica in held):
            replicas, synced = self._replicas(rule), True
        else:
            replicas, synced = cast("list[MassReplica]", held), False  # none is None
        pieces: list[tuple[int, Any, np.ndarray, float]] = []
        got, rounds = 0, 0
        while got < n:
            rounds += 1
            if rounds > _ROUNDS:
                raise SamplingError(
                    f"buffer {self.name!r}: the shards' total masses kept changing between "
                    f"the choice of shards and their commits ({_ROUNDS} rounds)")
            before = self._log_masses(replicas)
            if not np.isfinite(before).any():
                if not synced:  # empty as last seen: ask again before saying so
                    replicas, synced = self._replicas(rule), True
                    continue
                raise EmptyBufferError(f"buffer {self.name!r}: buffer is empty (no item "
                                       "with a non-zero mass)")
            share = np.exp(before - before.max())
            if local:
                counts = np.zeros(self.count, dtype=np.int64)
                counts[self._choose(share)] = n - got
            else:
                counts = self.rng.multinomial(n - got, share / share.sum())
            calls: dict[int, tuple[Any, tuple[Any, ...]]] = {
                k: (commit, (k, c, replacement)) for k, c in enumerate(counts.tolist()) if c}
            try:
                drawn = self._all_or_none(calls)
            except EmptyBufferError:
                # a shard chosen holds no mass at its commit (the others' draws are taken
                # back): its share there is 0, so the round is drawn again from the masses
                # now; only when no shard holds mass does the error come out (above)
                replicas, synced = self._replicas(rule), True
                if np.isfinite(self._log_masses(replicas)[list(calls)]).all():
                    raise  # every shard asked holds mass: not an emptied shard
                continue
            after = before
            if not inline:
                # every shard's mass just after the commits: one request to every shard at
                # once (a drawn shard's replica is current: its reply is short)
                try:
                    if len(drawn) < self.count:
                        replicas, synced = self._replicas(rule, current=drawn), True
                    after = self._log_masses(replicas)
                except BaseException:
                    self._undo(drawn)
                    raise
            if not np.isfinite(after).any() or (~np.isfinite(before) & np.isfinite(after)).any():
                self._undo(drawn)  # a shard that could not be chosen holds mass now
                continue
            # T'_k / T_k over the largest ratio, in logs: a total that grew by more than
            # e^709 (a new item of a far higher log-reward) would overflow the ratio itself
            growth = np.full(self.count, -math.inf)
            able = np.isfinite(before)  # (a shard not able to be chosen has no mass now)
            growth[able] = after[able] - before[able]
            chance = np.exp(growth - growth.max())
            cut = np.exp(after - after.max())
            cut /= cut.sum()
            for k, draw in drawn.items():
                stands = np.ones(len(draw.ids), dtype=bool)
                if chance[k] < 1:
                    coins = self.rng.random(1 if local else len(draw.ids))
                    stands = np.broadcast_to(coins < chance[k], (len(draw.ids),))
                    if not stands.all():
                        taken_back = [b"%012d" % draw.ids[j] for j in np.flatnonzero(~stands)]
                        with self._on_shard(k):
                            self.shards[k]._run("undo_draws", self.shards[k].keys.all_keys(),
                                                taken_back)
                kept = np.flatnonzero(stands)
                if len(kept):
                    pieces.append((k, draw, kept, float(cut[k])))
                    got += len(kept)
        return pieces, replicas, rounds

    def _assembled(
        self, pieces: list[tuple[int, Any, np.ndarray, float]], rounds: int,
        shuffle: bool = True,
    ) -> Drawn:
        """The draws of :meth:`_rounds`' pieces: global ids, blobs, each one's probability
        (within its shard at the commit, times the shard's share), shuffled unless one
        piece (already in random order) or ``shuffle`` is False."""
        ids: list[int] = []
        blobs: list[bytes] = []
        probabilities = []
        for k, draw, kept, share in pieces:
            ids += [draw.ids[j] * self.count + k for j in kept]
            blobs += [draw.blobs[j] for j in kept]
            probabilities.append(np.asarray(draw.probabilities)[kept] * share)
        first = pieces[0]
        source = (first[0], first[1].schema_json)
        probability = np.concatenate(probabilities)
        if not shuffle or len(pieces) == 1:
            return ids, blobs, probability, source
        order = self.rng.permutation(len(ids))
        return [ids[i] for i in order], [blobs[i] for i in order], probability[order], source

    def _log_masses(self, replicas: list[MassReplica]) -> np.ndarray:
        """Each shard's total mass as its replica holds it, as a log (-inf: none); raises
        while a softmax replica holds an item of log-reward +inf."""
        out = np.full(len(replicas), -math.inf)
        for k, replica in enumerate(replicas):
            with replica.lock:
                if replica.rule == "softmax" and replica.infinite > 0:
                    raise SamplingError(
                        f"buffer {self.name!r}: shard {k} holds {replica.infinite} item(s) of "
                        "log-reward +inf: the softmax of log-rewards is undefined; sample "
                        "uniformly or remove them"
                    )
                if replica.total > 0 and replica.positive:
                    out[k] = math.log(replica.total) + (
                        replica.ref if replica.rule == "softmax" else 0.0)
        return out

    def _per_commit(self, k: int, count: int, replacement: bool) -> Any:
        """Shard ``k``'s PER draw of ``count`` with replacement, committed there."""
        with self._on_shard(k):
            shard = self.shards[k]
            return commits.replica_draw(shard.view, "per", count, shard.rng, replacement)

    def sample(
        self,
        n: int,
        replacement: bool | None = None,
        *,
        block: bool = False,
        timeout: float | None = 30.0,
        min_size: int | None = None,
    ) -> Any:
        """Draw ``n`` items over all shards (uniform, softmax of log-rewards with
        ``prioritized_sampling``, or PER with ``sampler=PERSampler(...)``; without
        replacement unless ``replacement=True`` or ``n`` exceeds the length, PER always
        with) by the buffer's ``batch_law``: ``"global"``, the distribution of an
        unsharded :meth:`ReplayBuffer.sample`; ``"shard_local"``, the whole batch from
        one shard chosen by its mass, every draw's marginal law the global one (see
        :mod:`redisbuf.buffers.sharded_draws`). One batch of the buffer's kind.
        ``block``, ``timeout`` and ``min_size`` as :meth:`ReplayBuffer.sample`. A drawn
        record that does not decode is set aside in its shard's quarantine hash and the
        draw made again, as there.

        Args:
            n: how many items to draw.
            replacement: as :meth:`ReplayBuffer.sample`.
            block: as :meth:`ReplayBuffer.sample`.
            timeout: as :meth:`ReplayBuffer.sample`.
            min_size: as :meth:`ReplayBuffer.sample`.

        Returns:
            One batch of the buffer's kind.

        Raises:
            ValueError: ``n`` is not a positive integer.
            EmptyBufferError: there is nothing to draw.
            SamplingError: prioritized sampling is undefined (as :meth:`ReplayBuffer.sample`).
            ShardUnavailableError: a shard the draw needs is lost.
            WaitTimeoutError: ``block`` and ``timeout`` passed first.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ShardedReplayBuffer
            >>> buffer = ShardedReplayBuffer(fakeredis.FakeRedis(), "demo", shards=2)
            >>> for start in (0.0, 10.0):
            ...     _ = buffer.add({"obs": np.arange(start, start + 2), "log_rewards": np.zeros(2)})
            >>> sorted(buffer.sample(4)["obs"])
            [0.0, 1.0, 10.0, 11.0]
        """
        return self.sample_with_info(
            n, replacement, block=block, timeout=timeout, min_size=min_size
        ).batch

    def sample_with_info(
        self,
        n: int,
        replacement: bool | None = None,
        *,
        block: bool = False,
        timeout: float | None = 30.0,
        min_size: int | None = None,
    ) -> SampleInfo:
        """Like :meth:`sample`, also returning the global ids and, for prioritized
        sampling, each draw's probability (its mass over the whole buffer's; without
        replacement, given the earlier draws: for a ``"shard_local"`` batch, the chosen
        shard's share of the mass times the shard's own successive probability); with
        PER also ``weights`` and ``importance_weights`` over the whole buffer (the
        lowest mass and the mean non-zero priority of every shard), in either law.

        Args:
            n: as :meth:`sample`.
            replacement: as :meth:`sample`.
            block: as :meth:`sample`.
            timeout: as :meth:`sample`.
            min_size: as :meth:`sample`.

        Returns:
            The batch with its global ids, probabilities and PER weights.

        Raises:
            EmptyBufferError: as :meth:`sample`.
        """
        if block:
            drawn = self._wait_and_draw(n, replacement, timeout, min_size)
        else:
            drawn = self._draw(n, replacement)
        (ids, _, probabilities, _), batch = self._decoded(drawn, n, replacement)
        if self.per is not None:
            weights, importance = self._last_weights
            return SampleInfo(batch, np.array(ids, dtype=np.int64), probabilities, weights,
                              importance)
        return SampleInfo(batch, np.array(ids, dtype=np.int64), probabilities)

    def _decoded(self, drawn: Any, n: int, replacement: bool | None) -> tuple[Any, Any]:
        """A draw of :meth:`_draw` and its batch. Records that do not decode are set aside
        in their shard's quarantine hash and the draw is taken back and made again, as
        :meth:`ReplayBuffer.sample` does (redisbuf/buffers/quarantine.py)."""
        for _ in range(quarantine.ROUNDS):
            ids, blobs, _, (k, schema_json) = drawn
            try:
                return drawn, self.shards[k].decode(blobs, ids, schema_json)
            except DecodeError as exc:
                failure = exc
            bad = quarantine.undecodable(self.shards[k], blobs)
            if not bad:
                raise failure
            local: dict[int, list[int]] = {}
            for item in ids:
                local.setdefault(item % self.count, []).append(item // self.count)
            for shard, items in local.items():
                with self._on_shard(shard):
                    quarantine.take_back(self.shards[shard], items)
            for position, error in bad:
                shard = ids[position] % self.count
                with self._on_shard(shard):
                    quarantine.set_aside(self.shards[shard], [
                        (ids[position] // self.count, blobs[position], error)])
            drawn = self._draw(n, replacement)
        ids, blobs, _, (k, schema_json) = drawn
        return drawn, self.shards[k].decode(blobs, ids, schema_json)

    def _wait_and_draw(
        self, n: int, replacement: bool | None, timeout: float | None, min_size: int | None
    ) -> tuple[list[int], list[bytes], Any, Any]:
        """Wait until the shards hold ``min_size`` (default ``n``) items and a draw
        succeeds, polling (5 ms doubling to 100 ms); WaitTimeoutError after ``timeout``."""
        need = n if min_size is None else int(min_size)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            if len(self) >= need:
                try:
                    return self._draw(n, replacement)
                except EmptyBufferError:
                    pass
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"buffer {self.name!r}: sample({n}) waited {timeout} s for {need} "
                    f"drawable items; it holds {len(self)}"
                )
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            pause = min(2 * pause, 0.1)

"""The prioritized engine under the interleavings an independent review found wrong: each
test puts a second, spawned process's change at the worst moment for this process's
draw (between its replica's catch-up and its commit, right after a clear) and checks the
law (binomial / chi-square), the ids returned, or a time limit."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
from peer_process import Peer
from process_helpers import fresh_context
from test_sampling import chi2, chi2_limit

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.sampling import first_read
from redisbuf.sampling import replica as replica_module
from redisbuf.sampling.replica import MassReplica, replica_of
from redisbuf.store.keys import BufferKeys

pytestmark = [pytest.mark.redis_server, pytest.mark.multiprocess]


def _batch(log_rewards) -> dict:
    log_rewards = np.asarray(log_rewards, dtype=np.float64)
    return {"x": np.arange(len(log_rewards)), "log_rewards": log_rewards}


def _fill(buffer: ReplayBuffer, n: int, per_add: int = 1000) -> None:
    """Add n items, ``per_add`` a call (one add is bounded, redisbuf/store/bounds.py)."""
    for start in range(0, n, per_add):
        buffer.add(_batch(np.zeros(min(per_add, n - start))))


@pytest.fixture
def url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def peer_factory(url, buffer_name):
    peers: list[Peer] = []

    def make(**options) -> Peer:
        peer = Peer(url, buffer_name, **options)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.stop()


@pytest.mark.parametrize("reset", ["clear", "drop_and_create"])
def test_a_draw_of_an_earlier_epoch_never_commits(url, buffer_name, peer_factory, reset):
    """B's replica is current; A clears (or drops and re-creates) the buffer and then makes
    as many changes as B's replica had seen: B's next draws hold only items present now,
    and the use counts land on them (none on ids that are gone)."""
    per = {"alpha": 1.0, "eps": 0.0}
    a = peer_factory(capacity=100, per=per)
    b = ReplayBuffer(url, buffer_name, capacity=100, sampler=PERSampler(**per), seed=2)
    b.add(_batch(np.zeros(10)))
    b.update_priority(b.sample_with_info(4).ids, [1.0, 2.0, 3.0, 4.0])
    b.sample_with_info(8)  # B's replica is current here
    seen = replica_of(b.view, "per").version
    a(reset)
    present: set[int] = set()
    while int(b.client.hget(b.keys.meta, "log_version")) < seen:
        present.update(a("add", log_rewards=[0.0]))  # each add is one log entry
    assert int(b.client.hget(b.keys.meta, "log_version")) == seen
    for _ in range(5):
        ids = b.sample_with_info(16).ids
        assert set(ids.tolist()) <= present
    uses = {int(k): int(v) for k, v in b.client.hgetall(b.keys.uses).items()}
    assert set(uses) <= present and sum(uses.values()) == 5 * 16
    assert b.stats()["sampled"] == 5 * 16


@pytest.mark.parametrize("writer_replica", [False, True],
                         ids=["writer-reads-items", "writer-from-its-replica"])
def test_a_stale_draw_follows_the_law_after_another_process_cut_a_priority(
    url, buffer_name, peer_factory, writer_replica
):
    """The review's scenario: right after another process cut a heavy item's priority from
    9 to 0.5, a draw of 1 from a replica that has not seen the cut: the heavy item must come
    with the current probability (0.5 / 1.5 = 1/3), not the 0.48 a redraw of the whole
    batch gave; the returned probability says the same. The cutting process has no
    replica, or a current one: either way its change is one V entry, which carries no
    score from before the cut."""
    per = {"alpha": 1.0, "eps": 0.0}
    a = peer_factory(capacity=10, per=per)
    sampler = ReplayBuffer(url, buffer_name, capacity=10, sampler=PERSampler(**per), seed=5)
    ids = sampler.add(_batch([0.0, 0.0, 0.0]), priorities=[9.0, 0.5, 0.5]).ids.tolist()
    heavy = ids[0]
    rounds, hits = 400, 0
    for _ in range(rounds):
        sampler.update_priority([heavy], [9.0])  # this process's replica is current again
        if writer_replica:
            a("sample", n=1)  # the writer's replica catches up
        a("update_priority", ids=[heavy], priorities=[0.5])  # the worst moment
        entry = sampler.client.lindex(sampler.keys.masslog, -1)
        assert entry[:1] == b"V"
        info = sampler.sample_with_info(1)
        hits += int(info.ids[0] == heavy)
        assert info.probabilities[0] == pytest.approx(1 / 3)
    # within 4.5 standard deviations of the law (p ~ 7e-6); 0.48 is 6 of them away
    assert abs(hits - rounds / 3) < 4.5 * np.sqrt(rounds * (1 / 3) * (2 / 3)), hits / rounds


def test_a_stale_softmax_draw_without_replacement_follows_the_law(
    url, buffer_name, peer_factory
):
    """Softmax, without replacement: another process changes the buffer between this
    process's catch-up and its commit every time; the draw that stands follows the law of
    the buffer at its commit (chi-square over which of 4 items comes first)."""
    a = peer_factory(capacity=1000, softmax=True)
    sampler = ReplayBuffer(url, buffer_name, capacity=1000, prioritized_sampling=True, seed=9)
    log_rewards = np.log([1.0, 2.0, 3.0, 4.0])
    ids = sampler.add(_batch(log_rewards)).ids.tolist()
    rounds = 300
    firsts = []
    for _ in range(rounds):
        sampler.sample(1)  # current
        a("add", log_rewards=[-1e9])  # an item of ~0 mass: the law among the 4 stays
        firsts.append(int(sampler.sample_with_info(2).ids[0]))
    observed = np.array([firsts.count(i) for i in ids])
    expected = np.array([1.0, 2.0, 3.0, 4.0]) / 10 * rounds
    assert chi2(observed, expected) < chi2_limit(3), observed


def test_an_item_added_before_a_draw_without_replacement_is_seen(
    url, buffer_name, peer_factory
):
    """After a draw with replacement that the server had to correct, another process adds
    an item of overwhelming log-reward; the next draw of 1 without replacement must see
    it (the review found it missed in 20 of 20 rounds)."""
    a = peer_factory(capacity=10_000, softmax=True)
    sampler = ReplayBuffer(url, buffer_name, capacity=10_000, prioritized_sampling=True, seed=1)
    sampler.add(_batch(np.zeros(20)))
    for round_ in range(20):
        sampler.sample(1)
        a("add", log_rewards=[0.0])
        sampler.sample(8, replacement=True)  # corrected by the server
        # each round's item outweighs everything before it by e^60
        heavy = a("add", log_rewards=[60.0 * (round_ + 1)])[0]
        assert sampler.sample_with_info(1, replacement=False).ids.tolist() == [heavy]


def test_softmax_without_replacement_over_rewards_far_apart_returns(url, buffer_name):
    """Log-rewards that differ by more than ~745 (exp underflows to 0) used to make a draw
    without replacement of every item spin forever: it returns, the item of the highest
    log-reward first, the underflowed ones after, in the law among themselves."""
    buffer = ReplayBuffer(url, buffer_name, capacity=100, prioritized_sampling=True, seed=3)
    ids = buffer.add(_batch([0.0, -800.0, -800.0, -1600.0])).ids.tolist()
    done: list = []
    thread = threading.Thread(target=lambda: done.append(buffer.sample_with_info(4).ids),
                              daemon=True)
    thread.start()
    thread.join(20)
    assert done, "the draw without replacement did not return in 20 s"
    drawn = done[0].tolist()
    assert drawn[0] == ids[0] and drawn[3] == ids[3] and set(drawn[1:3]) == set(ids[1:3])


@pytest.mark.parametrize("above", [710.0, 1000.0, float("inf")])
def test_a_stale_softmax_draw_sees_an_item_far_above_its_reference(
    url, buffer_name, peer_factory, above
):
    """This process's replica is current with every log-reward 0 (its reference); another
    process adds one item ``above`` higher, beyond exp's range from that reference. The
    next draw with replacement, corrected on the server, must follow the law at the
    commit: every draw is the new item (the others weigh e^-710 or less beside it), and
    a +inf log-reward raises as it does for a replica that knew it (the review saw the
    server's correction overflow and keep every stale draw)."""
    from redisbuf.errors import SamplingError

    a = peer_factory(capacity=100, softmax=True)
    sampler = ReplayBuffer(url, buffer_name, capacity=100, prioritized_sampling=True, seed=1)
    sampler.add(_batch(np.zeros(10)))
    sampler.sample(5, replacement=True)  # current, reference 0
    heavy = a("add", log_rewards=[above])[0]
    if above == float("inf"):
        with pytest.raises(SamplingError, match=r"\+inf"):
            sampler.sample(200, replacement=True)
        return
    info = sampler.sample_with_info(200, replacement=True)
    assert set(info.ids.tolist()) == {heavy}
    assert np.allclose(info.probabilities, 1.0)


def test_softmax_without_replacement_keeps_the_law_among_nearly_underflowed_items(
    url, buffer_name
):
    """Log-rewards 0, -744 and -745.2: once the first is drawn, the other two weigh e^-744
    (a subnormal) and e^-745.2 (0 in float64) beside the reference; the second draw must
    still follow their law among themselves (0.769 / 0.231; the review saw the second
    always the -744 one)."""
    buffer = ReplayBuffer(url, buffer_name, capacity=10, prioritized_sampling=True, seed=4)
    ids = buffer.add(_batch([0.0, -744.0, -745.2])).ids.tolist()
    rounds = 600
    seconds = [int(buffer.sample_with_info(2, replacement=False).ids[1]) for _ in range(rounds)]
    share = 1 / (1 + np.exp(-745.2 + 744.0))
    hits = seconds.count(ids[1])
    assert hits + seconds.count(ids[2]) == rounds
    # within 4.5 standard deviations of the law (p ~ 7e-6); all of them is 14 away
    assert abs(hits - rounds * share) < 4.5 * np.sqrt(rounds * share * (1 - share)), hits


@pytest.mark.parametrize("how", ["priorities to 0", "evicted by zero-priority items"])
def test_a_stale_per_draw_after_every_mass_went_raises_instead_of_spinning(
    url, buffer_name, peer_factory, how
):
    """This process's replica is current with priorities 0.1, 0.2, 0.3 (its total
    0.6000000000000001); another process sets them all to 0, or evicts them all with
    items of priority 0. The server's correction then leaves a rounding residue as the
    untouched items' share (the review saw every draw come back as a hole, and the hole
    filling spin forever): the draw must raise EmptyBufferError, within a time limit."""
    from redisbuf.errors import EmptyBufferError

    per = {"alpha": 1.0, "eps": 0.0}
    a = peer_factory(capacity=3, per=per)
    b = ReplayBuffer(url, buffer_name, capacity=3, sampler=PERSampler(**per), seed=1)
    ids = b.add(_batch(np.zeros(3))).ids.tolist()
    b.update_priority(ids, [0.1, 0.2, 0.3])
    b.sample_with_info(2, replacement=True)  # current
    if how == "priorities to 0":
        a("update_priority", ids=ids, priorities=[0.0, 0.0, 0.0])
    else:
        a("add", log_rewards=[0.0, 0.0, 0.0], priorities=[0.0, 0.0, 0.0])
    outcome: list = []

    def draw() -> None:
        try:
            outcome.append(b.sample_with_info(2, replacement=True))
        except EmptyBufferError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, "the draw did not return in 30 s"
    assert isinstance(outcome[0], EmptyBufferError), outcome[0]


def test_with_or_without_replacement_follows_the_length_as_the_sample_begins(
    url, buffer_name, peer_factory
):
    """torchgfn's rule: a softmax draw of n is without replacement unless n exceeds the
    buffer's length, the length as the sample begins (another process's adds and clears
    before it included), not the one this process's replica last saw (the review saw
    sample(5) of 5 items repeat ids after another process's add, and sample(3) of 2
    raise after its clear)."""
    a = peer_factory(capacity=100, softmax=True)
    sampler = ReplayBuffer(url, buffer_name, capacity=100, prioritized_sampling=True, seed=1)
    sampler.add(_batch([0.0, 1.0, 2.0]))
    for round_ in range(8):
        sampler.sample(2)  # the replica is current
        a("add", log_rewards=[float(round_)])
        n = len(sampler)
        assert n == 4 + round_
        ids = sampler.sample_with_info(n).ids.tolist()
        assert len(set(ids)) == n, ids
    a("clear")
    a("add", log_rewards=[0.0, 1.0])
    assert len(sampler.sample_with_info(3).ids) == 3  # more than the length: with replacement


def _add_forever(url: str, name: str, stop, index: int, batch: int = 16) -> None:
    buffer = ReplayBuffer(url, name, capacity=None)
    rng = np.random.default_rng(index)
    while not stop.is_set():
        buffer.add(_batch(rng.normal(size=batch)))


@contextlib.contextmanager
def _two_writers(url: str, buffer: ReplayBuffer, until_inserted: int, batch: int = 16):
    """Two spawned processes adding to ``buffer`` as fast as they can, ``batch`` items an
    add, from when the buffer has had ``until_inserted`` inserts until the block ends
    (they must exit cleanly)."""
    ctx = fresh_context()
    stop = ctx.Event()
    writers = [ctx.Process(target=_add_forever, args=(url, buffer.name, stop, k, batch))
               for k in range(2)]
    for writer in writers:
        writer.start()
    try:
        deadline = time.monotonic() + 60
        while _inserted(buffer) < until_inserted:  # (stats() would sync this one's replica)
            assert time.monotonic() < deadline, "the writers did not start adding"
            time.sleep(0.05)
        yield
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    assert all(writer.exitcode == 0 for writer in writers)


def test_softmax_draws_with_replacement_stand_under_two_writers(url, buffer_name):
    """Two processes add as fast as they can while this one draws 32 with replacement from a
    softmax buffer 200 times: every draw stands (the review saw SamplingError in up to
    30% of calls)."""
    buffer = ReplayBuffer(url, buffer_name, capacity=5000, prioritized_sampling=True, seed=4)
    buffer.add(_batch(np.zeros(64)))
    with _two_writers(url, buffer, 64 + 2000):
        for _ in range(200):
            assert len(buffer.sample_with_info(32, replacement=True).ids) == 32


def test_a_first_read_finishes_while_two_processes_add(url, buffer_name, monkeypatch):
    """A new replica of a full PER buffer reads it in slices while two processes add: the
    log entries after the version it started from are kept for it, so it finishes (the
    review's sampler restarted 20 times and gave up), and it then holds exactly what the
    buffer holds."""
    capacity = 20_000  # the log keeps 10,000 rows: the writers pass that during the read
    buffer = ReplayBuffer(url, buffer_name, capacity=capacity, sampler=PERSampler(), seed=1)
    _fill(buffer, capacity)
    monkeypatch.setattr(first_read, "_SCAN_COUNT", 100)  # ~200 slices: a long read
    read_scores = replica_module.read_scores
    attempts = 0

    def reading(*args):
        nonlocal attempts
        attempts += 1
        return read_scores(*args)

    monkeypatch.setattr(replica_module, "read_scores", reading)
    with _two_writers(url, buffer, capacity + 3000):
        replica = MassReplica("per")
        replica.load(buffer.view)
        moved = buffer.stats()["inserted"]
    monkeypatch.setattr(replica_module, "read_scores", read_scores)
    assert attempts == 1  # finished in one read, however long the machine made it take
    assert moved > capacity + 3000  # writers kept adding during the read
    replica.sync(buffer.view)
    truth = _truth(buffer)
    held = ~np.isnan(replica.scores[: replica.count])
    mine = dict(zip(replica.ids[: replica.count][held].tolist(),
                    replica.scores[: replica.count][held].tolist(), strict=True))
    assert mine == truth


def _truth(buffer: ReplayBuffer) -> dict[int, float]:
    """Item id -> PER priority now: a new replica's read (snapshot and log), a random
    sample of which the server's own read (lua/priority_read.lua) confirms."""
    fresh = MassReplica("per")
    fresh.load(buffer.view)
    held = ~np.isnan(fresh.scores[: fresh.count])
    out = dict(zip(fresh.ids[: fresh.count][held].tolist(),
                   fresh.scores[: fresh.count][held].tolist(), strict=True))
    ids = np.array(sorted(out), dtype=np.int64)
    some = np.random.default_rng(0).choice(ids, min(64, len(ids)), replace=False)
    assert buffer.priorities(some).tolist() == [out[int(i)] for i in some]
    return out


def _inserted(buffer: ReplayBuffer) -> int:
    """The buffer's inserts so far, read without touching its replicas (stats() would)."""
    return int(buffer.client.hget(BufferKeys(buffer.name).meta, "inserted") or 0)


def _inserted_past(buffer: ReplayBuffer, count: int) -> None:
    """Wait until the buffer has had ``count`` inserts."""
    deadline = time.monotonic() + 60
    while _inserted(buffer) < count:
        assert time.monotonic() < deadline, "the writers stopped adding"
        time.sleep(0.01)


@pytest.mark.parametrize("rule", ["per", "softmax"])
def test_a_first_read_keeps_the_log_until_it_has_caught_up(url, buffer_name, monkeypatch,
                                                           rule):
    """A new replica of a full buffer (40,000 items: no snapshot) reads it in slices while
    two processes add 512 items a call at capacity. During the read they log more rows
    than one catch-up reply carries (20,000) plus what the log keeps (10,000), and they
    add again while the replica applies its first reply: the log keeps the entries after
    the version the read began at until the replica has caught up, so the read finishes
    in one attempt and the replica holds what the buffer holds (the pin was once dropped
    with the first reply: every attempt failed and the read gave up after 20)."""
    capacity = 40_000
    if rule == "per":
        buffer = ReplayBuffer(url, buffer_name, capacity=capacity, sampler=PERSampler(),
                              seed=1)
    else:
        buffer = ReplayBuffer(url, buffer_name, capacity=capacity, prioritized_sampling=True,
                              seed=1)
    _fill(buffer, capacity)
    buffer.sample(2)  # prioritized sampling on (the mass log kept)
    if rule == "per":  # no snapshot: the read is of the epoch's base and the whole log
        buffer.client.delete(BufferKeys(buffer_name).snap)
        buffer.client.hdel(BufferKeys(buffer_name).meta, "snap_epoch", "snap_version")
    scan = first_read._scan
    read_scores = replica_module.read_scores
    attempts = parsed = applied = 0

    def reading(*args):  # every attempt meets the same writes
        nonlocal attempts, parsed, applied
        attempts += 1
        parsed = applied = 0
        return read_scores(*args)

    def slow(*args):  # mid-read, the writers log 2 x 20,000 rows (an add, an eviction)
        nonlocal parsed
        for step in scan(*args):
            parsed += 1
            if parsed == 2:
                _inserted_past(buffer, _inserted(buffer) + 20_000)
            yield step

    apply = MassReplica.apply

    def applying(self, entry):  # while the first reply is applied, the writers add again
        nonlocal applied
        applied += 1
        if applied == 1:
            _inserted_past(buffer, _inserted(buffer) + 1024)
        return apply(self, entry)

    with _two_writers(url, buffer, capacity + 2000, batch=512):
        monkeypatch.setattr(first_read, "_SCAN_COUNT", 2000)
        monkeypatch.setattr(replica_module, "read_scores", reading)
        monkeypatch.setattr(first_read, "_scan", slow)
        monkeypatch.setattr(MassReplica, "apply", applying)
        replica = MassReplica(rule)
        replica.load(buffer.view)
        monkeypatch.undo()
    assert attempts == 1
    replica.sync(buffer.view)
    keys = BufferKeys(buffer_name)
    if rule == "per":
        truth = _truth(buffer)
    else:
        truth = {int(m): s for m, s in buffer.client.zrange(keys.prio, 0, -1, withscores=True)}
    held = ~np.isnan(replica.scores[: replica.count])
    mine = dict(zip(replica.ids[: replica.count][held].tolist(),
                    replica.scores[: replica.count][held].tolist(), strict=True))
    assert mine == truth
    assert buffer.client.hget(keys.meta, "log_pins") is None


def test_a_replica_far_behind_catches_up_in_bounded_replies(url, buffer_name):
    """No reply carries more than a bounded number of logged rows, however far behind a
    replica is: it catches up in several, and then matches a fresh read."""
    buffer = ReplayBuffer(url, buffer_name, capacity=200_000, sampler=PERSampler(), seed=1)
    buffer.add(_batch(np.zeros(10)))
    buffer.sample(2)
    replica = replica_of(buffer.view, "per")
    other = ReplayBuffer(url, buffer_name, capacity=None)
    _fill(other, 60_000)  # 60 000 rows behind, 60 entries
    replies: list[int] = []
    run = buffer._run

    def counting(name, keys, args):
        reply = run(name, keys, args)
        if name == "masslog_read":
            replies.append(sum(int(e.split(b"|")[1]) for e in reply[4:]))
        return reply

    buffer._run = counting
    replica.sync(buffer.view)
    assert len(replies) >= 3 and max(replies) <= 20_000 + 1000
    fresh = MassReplica("per")
    fresh.load(other.view)
    assert len(replica) == len(fresh) == 60_010


def test_the_replica_costs_at_most_32_bytes_an_item(url, buffer_name):
    buffer = ReplayBuffer(url, buffer_name, capacity=100_000, sampler=PERSampler(), seed=1)
    _fill(buffer, 100_000)
    replica = replica_of(buffer.view, "per")
    assert len(replica) == 100_000
    assert replica.nbytes / len(replica) <= 32


def test_a_rolled_back_history_is_read_afresh(url, buffer_name):
    """The server's log goes back to an earlier state and then on with other changes (a
    restart from an older snapshot, a failover that lost writes), to the same version the
    replica had: the stamps differ, so the replica reads everything again and never draws
    an id the server no longer holds."""
    buffer = ReplayBuffer(url, buffer_name, capacity=1000, sampler=PERSampler(), seed=1)
    buffer.add(_batch(np.zeros(10)))
    keys = BufferKeys(buffer_name)
    saved = {key: buffer.client.dump(key) for key in keys.all_keys() if buffer.client.exists(key)}
    buffer.sample(2)
    buffer.add(_batch(np.zeros(5)))  # lost: ids 11-15
    buffer.sample(2)  # the replica follows to the lost version
    version = replica_of(buffer.view, "per").version
    for key in keys.all_keys():  # the server back to the older state
        buffer.client.delete(key)
    for key, value in saved.items():
        buffer.client.restore(key, 0, value)
    other = ReplayBuffer(url, buffer_name, capacity=None)
    other.add(_batch(np.zeros(2)))  # the same version in another history: ids 11-12
    assert int(buffer.client.hget(keys.meta, "log_version")) == version
    present = {int(m) for m in buffer.client.zrange(keys.order, 0, -1)}
    for _ in range(10):
        assert set(buffer.sample_with_info(20).ids.tolist()) <= present
    assert len(replica_of(buffer.view, "per")) == len(present)


def test_clear_drop_and_a_session_switch_of_a_large_buffer_are_no_long_command(
    url, buffer_name
):
    """clear(), a session switch (update_model_version with another session: every item
    goes) and drop() unlink the large keys (freed in the background) and move counters
    in O(1): the server's SLOWLOG shows no command of theirs over 100 ms (each took
    0.17-0.5 s at 2-4x10^5 items when they deleted the keys themselves)."""
    size = 300_000
    buffer = ReplayBuffer(url, buffer_name, capacity=size, sampler=PERSampler(), seed=1)
    client = buffer.client

    def slowest_of(operation) -> list:
        client.slowlog_reset()
        operation()
        return [entry["command"][:40] for entry in client.slowlog_get(128)]

    buffer.update_model_version("first", 0)
    _fill(buffer, size)
    client.config_set("slowlog-log-slower-than", 100_000)
    try:
        assert slowest_of(buffer.clear) == []
        _fill(buffer, size)
        assert slowest_of(lambda: buffer.update_model_version("second", 1)) == []
        assert len(buffer) == 0 and buffer.stats()["stale_removed"] == size
        _fill(buffer, size)
        assert slowest_of(buffer.drop) == []
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)


@pytest.mark.parametrize("change", ["rescore", "evict"])
def test_an_update_sent_from_a_replica_made_stale_applies_in_the_logs_order(
    url, buffer_name, peer_factory, monkeypatch, change
):
    """This process's replica is current when it sends its update (with the replica's
    version); a spawned process then changes the same items before the script runs:
    re-scores two of them, or adds items that evict them. The update's entry lands after
    the peer's: replicas apply both in that order, so this update's priorities win where
    the items are still stored and the evicted ones are skipped; the count (by this
    process's replica, caught up from the reply) and every reader come out exact."""
    per = {"alpha": 1.0, "eps": 0.0}
    peer = peer_factory(capacity=4, per=per)
    mine = ReplayBuffer(url, buffer_name, capacity=4, sampler=PERSampler(**per), seed=1)
    ids = mine.add(_batch(np.zeros(4)), priorities=[1.0, 2.0, 3.0, 4.0]).ids.tolist()
    mine.sample(2)  # current from here
    added: list[int] = []
    run = mine._run

    def then_the_peer_changes_them(name, keys, args, *rest):
        if name == "update_priority":
            if change == "rescore":
                peer("update_priority", ids=ids[:2], priorities=[7.0, 8.0])
            else:  # FIFO at capacity 4: the two oldest go
                added.extend(peer("add", log_rewards=[0.0, 0.0], priorities=[5.0, 5.0]))
        return run(name, keys, args, *rest)

    monkeypatch.setattr(mine, "_run", then_the_peer_changes_them)
    updated = mine.update_priority(ids[:3], [0.5, 0.25, 6.0])
    monkeypatch.undo()
    assert mine.client.lindex(mine.keys.masslog, -1)[:2] == b"V|"
    if change == "rescore":
        expected = {ids[0]: 0.5, ids[1]: 0.25, ids[2]: 6.0, ids[3]: 4.0}
    else:
        expected = {ids[2]: 6.0, ids[3]: 4.0, added[0]: 5.0, added[1]: 5.0}
    assert updated == (3 if change == "rescore" else 1)
    replica = replica_of(mine.view, "per")  # caught up by the update's reply
    assert replica.version == int(mine.client.hget(mine.keys.meta, "log_version"))
    assert replica.score_sum == sum(expected.values()) and replica.nonzero == 4
    held = list(expected)
    assert replica.scores[replica.slots_of(np.array(held))].tolist() == [expected[i]
                                                                         for i in held]
    assert _truth(mine) == expected

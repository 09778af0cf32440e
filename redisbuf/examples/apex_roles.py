"""The Ape-X example's two roles (redisbuf/examples/apex_dqn.py runs them): an actor
steps CartPole with an epsilon-greedy policy from the learner's latest parameters and adds
n-step transitions with their initial priorities; the learner samples by PER, trains, and
writes the new priorities back. Their configuration (:class:`ApexConfig`) and the
parameters they share over Redis are here too."""

from __future__ import annotations

import queue as queue_module
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from redisbuf import PERSampler, ReplayBuffer, connect

ENV_ID = "CartPole-v1"
OBS_DIM = 4
ACTIONS = 2
#: the longest wait, in seconds, before an actor is restarted
MAX_RESTART_DELAY = 30.0


@dataclass(frozen=True)
class ApexConfig:
    """One run's settings; plain data, handed to the spawned processes as a dict."""

    url: str
    name: str = "apex"
    actors: int = 3
    seed: int = 0
    minutes: float = 10.0
    target: float = 475.0
    capacity: int = 100_000
    hidden: int = 128
    batch_size: int = 128
    lr: float = 1e-3
    gamma: float = 0.99
    n_step: int = 3
    alpha: float = 0.6
    beta0: float = 0.4
    #: learner steps over which beta goes linearly from beta0 to 1
    beta_steps: int = 20_000
    target_update: int = 1000
    min_replay: int = 2_000
    #: transitions per actor add
    add_batch: int = 64
    #: actor frames between parameter fetches
    refresh: int = 400
    #: learner steps between parameter publications
    publish_every: int = 20
    #: times each actor is restarted after it dies (0: a dead actor stays dead)
    max_restarts: int = 3
    #: seconds before an actor's first restart, doubled for each further restart of it
    #: (at most MAX_RESTART_DELAY)
    restart_delay: float = 1.0

    @property
    def params_key(self) -> str:
        # under the buffer's hash tag: same cluster slot, reachable with the same ACL
        return f"rb:{{{self.name}}}:apex:params"

    def epsilon(self, index: int) -> float:
        if self.actors == 1:
            return 0.4
        return 0.4 ** (1 + 7 * index / (self.actors - 1))


# -- parameters over Redis ---------------------------------------------------------------


def pack_params(params: dict[str, np.ndarray], version: int) -> bytes:
    """msgpack map of raw little-endian float32 bytes with their shapes: no pickle."""
    return msgpack.packb({
        "version": version,
        "params": {
            k: {"shape": list(v.shape), "data": np.ascontiguousarray(v, "<f4").tobytes()}
            for k, v in params.items()
        },
    })


def unpack_params(blob: bytes) -> tuple[int, dict[str, np.ndarray]]:
    doc = msgpack.unpackb(blob)
    params = {
        k: np.frombuffer(v["data"], dtype="<f4").reshape(v["shape"])
        for k, v in doc["params"].items()
    }
    return int(doc["version"]), params


def numpy_q(params: dict[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
    """Q-values of the learner's MLP (Linear-ReLU-Linear-ReLU-Linear), in numpy."""
    h = np.maximum(obs @ params["0.weight"].T + params["0.bias"], 0.0)
    h = np.maximum(h @ params["2.weight"].T + params["2.bias"], 0.0)
    return h @ params["4.weight"].T + params["4.bias"]


# -- actor -------------------------------------------------------------------------------


class NStep:
    """Turns one actor's steps into n-step transitions ``(obs, action, reward = sum_k
    gamma^k r_{t+k}, next_obs = obs_{t+m}, discount = gamma^m)`` with m <= n steps, or
    ``discount = 0`` when the episode terminated within them: no bootstrap through
    termination, but through truncation (CartPole's 500-step limit) the return is
    bootstrapped from the last observation as from any other."""

    FIELDS = ("obs", "action", "reward", "next_obs", "discount")

    def __init__(self, gamma: float, n: int) -> None:
        self.gamma, self.n = gamma, n
        self.pending: deque[tuple[np.ndarray, int, float]] = deque()
        self.cols: dict[str, list[Any]] = {k: [] for k in self.FIELDS}

    @property
    def ready(self) -> int:
        """Transitions complete and not yet taken."""
        return len(self.cols["obs"])

    def step(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray,
             terminated: bool, truncated: bool) -> None:
        self.pending.append((obs, action, reward))
        if terminated or truncated:
            self._emit(len(self.pending), next_obs, terminal=terminated)
        elif len(self.pending) == self.n:
            self._emit(1, next_obs, terminal=False)

    def _emit(self, count: int, next_obs: np.ndarray, terminal: bool) -> None:
        # the first `count` pending steps, each with its return to the end of `pending`
        rewards = [r for _, _, r in self.pending]
        for j in range(count):
            obs, action, _ = self.pending[j]
            self.cols["obs"].append(obs)
            self.cols["action"].append(action)
            self.cols["reward"].append(
                sum(self.gamma**k * r for k, r in enumerate(rewards[j:])))
            self.cols["next_obs"].append(next_obs)
            self.cols["discount"].append(
                0.0 if terminal else self.gamma ** (len(rewards) - j))
        for _ in range(count):
            self.pending.popleft()

    def take(self) -> dict[str, np.ndarray]:
        """The complete transitions as one batch (a dict of arrays), and forget them."""
        batch: dict[str, np.ndarray] = {
            "obs": np.asarray(self.cols["obs"], np.float32).reshape(-1, OBS_DIM),
            "action": np.asarray(self.cols["action"], np.int64),
            "reward": np.asarray(self.cols["reward"], np.float32),
            "next_obs": np.asarray(self.cols["next_obs"], np.float32).reshape(-1, OBS_DIM),
            "discount": np.asarray(self.cols["discount"], np.float32),
        }
        for values in self.cols.values():
            values.clear()
        return batch


def _open_buffer(config: ApexConfig, seed: int | None = None) -> ReplayBuffer:
    return ReplayBuffer(
        config.url, config.name, capacity=config.capacity, seed=seed,
        sampler=PERSampler(alpha=config.alpha, beta=config.beta0),
    )


def run_actor(config: ApexConfig, index: int, report: Callable[[list[Any]], None],
              should_stop: Callable[[], bool], start: int = 0) -> None:
    """Play until ``should_stop()``; report ``["episode", index, return, frames, t]`` and
    ``["frames", index, added, start]`` per add. ``start`` counts this actor's restarts
    (0: its first process); a restarted actor plays other episodes than its first
    process did, with the same epsilon."""
    import gymnasium as gym

    client = connect(config.url)
    buffer = _open_buffer(config, seed=config.seed * 1000 + index)
    env = gym.make(ENV_ID)
    rng = np.random.default_rng([config.seed, index] + ([start] if start else []))
    env_seed = config.seed * 1000 + index if start == 0 else int(rng.integers(2**31))
    eps = config.epsilon(index)
    gamma, n = config.gamma, config.n_step
    while (blob := client.get(config.params_key)) is None:
        if should_stop():
            return
        time.sleep(0.05)
    version, params = unpack_params(blob)

    nstep = NStep(gamma, n)

    def flush() -> None:
        batch = nstep.take()
        q = numpy_q(params, batch["obs"])[np.arange(len(batch["action"])), batch["action"]]
        bootstrap = numpy_q(params, batch["next_obs"]).max(axis=1)
        td = batch["reward"] + batch["discount"] * bootstrap - q
        buffer.add(batch, priorities=np.abs(td).astype(np.float64))
        report(["frames", index, len(batch["action"]), start])

    obs, _ = env.reset(seed=env_seed)
    episode_return = 0.0
    frames = 0
    while not should_stop():
        if rng.random() < eps:
            action = int(rng.integers(ACTIONS))
        else:
            action = int(np.argmax(numpy_q(params, obs.astype(np.float32))))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        frames += 1
        episode_return += float(reward)
        nstep.step(obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
        if terminated or truncated:
            report(["episode", index, episode_return, frames, time.time()])
            episode_return = 0.0
            obs, _ = env.reset()
        else:
            obs = next_obs
        if nstep.ready >= config.add_batch:
            flush()
        if frames % config.refresh == 0:
            blob = client.get(config.params_key)
            if blob is not None:
                version, params = unpack_params(blob)


# -- learner -----------------------------------------------------------------------------


def run_learner(config: ApexConfig, report: Callable[[list[Any]], None],
                should_stop: Callable[[], bool]) -> None:
    """Train until ``should_stop()``; report ``["learner", steps, sampled, seconds,
    blocked, io_busy, loss]`` about once a second, all since the first step (``blocked``:
    seconds the training loop waited for a batch; ``io_busy``: seconds its buffer thread
    spent inside ``sample_with_info`` and ``update_priority``)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    client = connect(config.url)

    def mlp() -> nn.Module:
        return nn.Sequential(
            nn.Linear(OBS_DIM, config.hidden), nn.ReLU(),
            nn.Linear(config.hidden, config.hidden), nn.ReLU(),
            nn.Linear(config.hidden, ACTIONS),
        )

    online, target = mlp(), mlp()
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=config.lr)
    version = 0

    def publish() -> None:
        state = {k: v.detach().numpy() for k, v in online.state_dict().items()}
        client.set(config.params_key, pack_params(state, version))

    publish()
    sampler = PERSampler(alpha=config.alpha, beta=config.beta0)
    buffer = ReplayBuffer(config.url, config.name, capacity=config.capacity,
                          seed=config.seed, sampler=sampler)
    while len(buffer) < config.min_replay:
        if should_stop():
            return
        time.sleep(0.1)

    # Ape-X's learner overlaps the buffer and the gradient step: one thread (the only one
    # that touches `buffer`) samples ahead and writes the priorities back while the
    # training loop computes
    io = _BufferIO(buffer, sampler, config)
    io.start()
    steps = 0
    blocked = 0.0
    started = last_report = time.perf_counter()
    loss_value = 0.0
    try:
        while not should_stop():
            t0 = time.perf_counter()
            info = io.next_batch(steps)
            blocked += time.perf_counter() - t0
            batch = info.batch
            obs = torch.from_numpy(np.array(batch["obs"]))
            action = torch.from_numpy(np.array(batch["action"]))
            reward = torch.from_numpy(np.array(batch["reward"]))
            next_obs = torch.from_numpy(np.array(batch["next_obs"]))
            discount = torch.from_numpy(np.array(batch["discount"]))
            weights = torch.from_numpy(np.asarray(info.weights, np.float32))
            with torch.no_grad():
                # double DQN: the online network picks, the target network evaluates
                best = online(next_obs).argmax(dim=1, keepdim=True)
                bootstrap = target(next_obs).gather(1, best).squeeze(1)
                y = reward + discount * bootstrap
            q = online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
            loss = (weights * nn.functional.smooth_l1_loss(q, y, reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(online.parameters(), 10.0)
            optimizer.step()
            io.update(info.ids, (y - q).detach().abs().numpy().astype(np.float64))
            steps += 1
            loss_value = loss.item()
            if steps % config.target_update == 0:
                target.load_state_dict(online.state_dict())
            if steps % config.publish_every == 0:
                version += 1
                publish()
            now = time.perf_counter()
            if now - last_report >= 1.0:
                last_report = now
                report(["learner", steps, steps * config.batch_size, now - started, blocked,
                        io.busy, loss_value])
    finally:
        io.close()


class _BufferIO:
    """The learner's buffer thread: keeps ``depth`` sampled batches ready and applies the
    priority updates in the order the training loop made them. ``busy`` is the seconds it
    spent inside ``sample_with_info`` and ``update_priority``."""

    def __init__(self, buffer: ReplayBuffer, sampler: PERSampler, config: ApexConfig,
                 depth: int = 2) -> None:
        import threading

        self.buffer, self.sampler, self.config = buffer, sampler, config
        self.batches: queue_module.Queue[Any] = queue_module.Queue(maxsize=depth)
        self.updates: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        self.busy = 0.0
        self.steps = 0
        self.error: BaseException | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="apex-buffer-io",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        config = self.config
        try:
            while not self._closed.is_set():
                self._apply_updates()
                if self.batches.full():
                    time.sleep(0.0005)
                    continue
                self.sampler.beta = config.beta0 + (1 - config.beta0) * min(
                    1.0, self.steps / config.beta_steps)
                t0 = time.perf_counter()
                info = self.buffer.sample_with_info(config.batch_size)
                self.busy += time.perf_counter() - t0
                self.batches.put(info)
        except BaseException as exc:  # handed to the training loop
            self.error = exc
            self.batches.put(None)

    def _apply_updates(self) -> None:
        while True:
            try:
                ids, priorities = self.updates.get_nowait()
            except queue_module.Empty:
                return
            t0 = time.perf_counter()
            self.buffer.update_priority(ids, priorities)
            self.busy += time.perf_counter() - t0

    def next_batch(self, steps: int) -> Any:
        self.steps = steps
        info = self.batches.get()
        if info is None:
            raise RuntimeError(f"the learner's buffer thread failed: {self.error!r}")
        return info

    def update(self, ids: np.ndarray, priorities: np.ndarray) -> None:
        self.updates.put((ids, priorities))

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)



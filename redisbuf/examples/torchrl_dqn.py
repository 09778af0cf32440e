"""TorchRL's DQN on CartPole-v1, with TorchRL's own buffer or with a redisbuf one.

Usage::

    python -m redisbuf.examples.torchrl_dqn --buffer torchrl  --seed 0 --out a.json
    python -m redisbuf.examples.torchrl_dqn --buffer redisbuf --seed 0 --out b.json

The recipe is that of TorchRL's CartPole DQN (sota-implementations/dqn, as released with
torchrl 0.14.1): an MLP Q-network (120, 84), epsilon-greedy exploration annealed from 1.0
to 0.05, batches of 1,000 frames, 100 updates of 128 transitions after each batch once
``init_random_frames`` are collected, Adam (lr 2.5e-4), L2 DQN loss with a target network
copied every 50 updates, gamma 0.99, a buffer of 10,000 transitions, and a deterministic
evaluation of 5 episodes at intervals. ``--frames`` (default 100,000) scales the run down
from TorchRL's 500,100 frames; the annealing and random-frame counts scale with it.

``--buffer torchrl`` runs TorchRL's loop in one process on
``TensorDictReplayBuffer(storage=LazyTensorStorage(10_000), ...)``. ``--buffer redisbuf``
changes that line to ``storage=RedisbufStorage(url, name, 10_000)`` and runs the collector
in a second (spawned) process that opens the same buffer by URL and name: it extends the
buffer with each batch, and the learner samples it. The two keep TorchRL's schedule (100
updates per 1,000 frames, weights sent to the collector after each batch's updates) so
the curves compare the buffers, not two schedules. Without ``--url`` an embedded server is
started. The JSON written by ``--out`` holds the evaluation curve (frames, mean return);
``--plot a.json b.json ... --png curves.png`` draws such files.

``--buffer redisbuf-slices`` is the n-step variant on trajectory slices: the collector
process appends its steps to a ``RedisbufSliceStorage`` (one stream), the learner samples
with TorchRL's ``SliceSampler(slice_len=8)`` (16 slices of 8 consecutive steps of one
episode a batch, each slice's last step marked truncated) and trains on the batch shaped
``[16, 8]`` with TorchRL's TD(lambda) estimator (lambda 0.9), which bootstraps at each
slice's end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
import uuid
from typing import Any

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler
from torchrl.envs import (
    ExplorationType,
    GymEnv,
    RewardSum,
    StepCounter,
    TransformedEnv,
    set_exploration_type,
)
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate, ValueEstimators

FRAMES_PER_BATCH = 1000
BUFFER_SIZE = 10_000
BATCH_SIZE = 128
UPDATES_PER_BATCH = 100
LR = 2.5e-4
GAMMA = 0.99
HARD_UPDATE = 50
TEST_EPISODES = 5
SLICE_LEN = 8
LAMBDA = 0.9


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.append_transform(RewardSum())
    env.set_seed(seed)
    return env


def make_model(env: TransformedEnv) -> QValueActor:
    mlp = MLP(in_features=env.observation_spec["observation"].shape[-1],
              out_features=env.action_spec.shape[-1], num_cells=[120, 84],
              activation_class=torch.nn.ReLU)
    return QValueActor(module=mlp, spec=env.action_spec, in_keys=["observation"])


def schedule(frames: int) -> dict[str, int]:
    """TorchRL's CartPole numbers scaled to ``frames`` total (500,100 in TorchRL)."""
    scale = frames / 500_100
    return {"annealing": max(1, int(250_000 * scale)),
            "init_random": max(FRAMES_PER_BATCH, int(10_000 * scale)),
            "test_interval": max(FRAMES_PER_BATCH, int(50_000 * scale))}


def evaluate(model: QValueActor, env: TransformedEnv) -> float:
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(TEST_EPISODES):
            rollout = env.rollout(max_steps=10_000, policy=model)
            returns.append(float(rollout["next", "reward"].sum()))
    return sum(returns) / len(returns)


def make_collector(model: QValueActor, frames: int, seed: int) -> tuple[Collector, Any]:
    plan = schedule(frames)
    greedy = EGreedyModule(annealing_num_steps=plan["annealing"], eps_init=1.0,
                           eps_end=0.05, spec=model.spec)
    collector = Collector(create_env_fn=lambda: make_env(seed), frames_per_batch=FRAMES_PER_BATCH,
                          policy=TensorDictSequential(model, greedy), total_frames=frames,
                          device="cpu", storing_device="cpu", max_frames_per_traj=-1,
                          init_random_frames=plan["init_random"],
                          auto_register_policy_transforms=False)
    collector.set_seed(seed)
    return collector, greedy


class Learner:
    """The DQN loss, optimizer, target updates and evaluation of TorchRL's recipe."""

    def __init__(self, model: QValueActor, seed: int, slices: bool = False) -> None:
        self.model, self.slices = model, slices
        self.loss = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
        if slices:  # n-step targets along each slice, bootstrapped at its end
            self.loss.make_value_estimator(ValueEstimators.TDLambda, gamma=GAMMA,
                                           lmbda=LAMBDA)
        else:
            self.loss.make_value_estimator(gamma=GAMMA)
        self.target = HardUpdate(self.loss, value_network_update_interval=HARD_UPDATE)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=LR)
        self.test_env = make_env(seed + 1000)

    def updates(self, rb: TensorDictReplayBuffer) -> float:
        total = 0.0
        for _ in range(UPDATES_PER_BATCH):
            batch = rb.sample(BATCH_SIZE)
            if self.slices:
                batch = batch.reshape(-1, SLICE_LEN)  # one slice per row
            loss = self.loss(batch)["loss"]
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()
            self.target.step()
            total += float(loss.detach())
        return total / UPDATES_PER_BATCH


def run_torchrl(frames: int, seed: int) -> list[tuple[int, float]]:
    torch.manual_seed(seed)
    model = make_model(make_env(seed))
    learner = Learner(model, seed)
    collector, greedy = make_collector(model, frames, seed)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE), batch_size=BATCH_SIZE,
                                prefetch=10)
    plan, collected, curve = schedule(frames), 0, []
    for data in collector:
        data = data.reshape(-1)
        rb.extend(data)
        collected += data.numel()
        greedy.step(data.numel())
        if collected < plan["init_random"]:
            continue
        learner.updates(rb)
        if collected % plan["test_interval"] < FRAMES_PER_BATCH or collected >= frames:
            curve.append((collected, evaluate(model, learner.test_env)))
    collector.shutdown()
    return curve


def shared_buffer(url: str, name: str, seed: int, slices: bool,
                  prefetch: int | None = None) -> TensorDictReplayBuffer:
    """The TorchRL buffer on the shared one: items, or steps sampled as slices."""
    from redisbuf.torchrl import RedisbufStorage
    from redisbuf.torchrl_slices import RedisbufSliceStorage

    if slices:
        return TensorDictReplayBuffer(
            storage=RedisbufSliceStorage(url, name, BUFFER_SIZE, seed=seed),
            sampler=SliceSampler(slice_len=SLICE_LEN), batch_size=BATCH_SIZE,
            prefetch=prefetch)
    return TensorDictReplayBuffer(storage=RedisbufStorage(url, name, BUFFER_SIZE, seed=seed),
                                  batch_size=BATCH_SIZE, prefetch=prefetch)


def inserted(rb: TensorDictReplayBuffer) -> int:
    """Frames the collector process has added to the shared buffer (the server's count)."""
    buffer = rb.storage.buffer
    if hasattr(buffer, "env_range"):  # a sequence buffer: the stream's next position
        return int(buffer.env_range(0)[1])
    return int(buffer.stats()["inserted"])


def collector_process(url: str, name: str, frames: int, seed: int, weights: Any,
                      done: Any, slices: bool = False) -> None:
    """The collector of ``--buffer redisbuf``: extends the shared buffer with each batch
    and then takes the learner's weights for that batch (TorchRL's schedule)."""
    torch.manual_seed(seed)
    model = make_model(make_env(seed))
    collector, greedy = make_collector(model, frames, seed)
    rb = shared_buffer(url, name, seed, slices)
    plan, collected = schedule(frames), 0
    for data in collector:
        data = data.reshape(-1)
        rb.extend(data)
        collected += data.numel()
        greedy.step(data.numel())
        if collected >= plan["init_random"]:
            model.load_state_dict(weights.get(timeout=600))
    collector.shutdown()
    done.put(collected)


def run_redisbuf(frames: int, seed: int, url: str | None,
                 slices: bool = False) -> list[tuple[int, float]]:
    from redisbuf.servers.embedded import EmbeddedServer

    server = EmbeddedServer().__enter__() if url is None else None
    url = server.url if server is not None else url
    assert url is not None
    name = f"torchrl-dqn-{uuid.uuid4().hex[:8]}"
    try:
        torch.manual_seed(seed)
        model = make_model(make_env(seed))
        learner = Learner(model, seed, slices)
        rb = shared_buffer(url, name, seed, slices, prefetch=10)
        ctx = mp.get_context("spawn")
        weights, done = ctx.Queue(), ctx.Queue()
        # the collector starts from the learner's initial weights, as in one process
        proc = ctx.Process(target=collector_process,
                           args=(url, name, frames, seed, weights, done, slices))
        proc.start()
        plan, curve = schedule(frames), []
        targets = [c for c in range(FRAMES_PER_BATCH, frames + 1, FRAMES_PER_BATCH)
                   if c >= plan["init_random"]]
        for collected in targets:
            # wait until the collector has inserted this batch (the server's count)
            while inserted(rb) < collected:
                if not proc.is_alive():
                    raise RuntimeError("the collector process died")
                time.sleep(0.01)
            learner.updates(rb)
            # a copy: the queue pickles in a thread, while the next updates change them
            weights.put({k: v.detach().clone() for k, v in model.state_dict().items()})
            if collected % plan["test_interval"] < FRAMES_PER_BATCH or collected >= frames:
                curve.append((collected, evaluate(model, learner.test_env)))
        done.get(timeout=600)
        proc.join(timeout=60)
        rb.storage.buffer.drop()
        return curve
    finally:
        if server is not None:
            server.__exit__(None, None, None)


def plot(paths: list[str], png: str) -> dict[str, Any]:
    """Plot the curves of the ``--out`` files ``paths`` (one line per run, a colour per
    buffer) into ``png``; returns buffer -> seed -> curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        runs.setdefault(run["buffer"], {})[run["seed"]] = run["curve"]
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"torchrl": "tab:blue", "redisbuf": "tab:orange", "redisbuf-slices": "tab:green"}
    labels = {"torchrl": "LazyTensorStorage, one process",
              "redisbuf": "RedisbufStorage, collector and learner processes",
              "redisbuf-slices": "RedisbufSliceStorage + SliceSampler, TD(lambda), two processes"}
    for buffer, seeds in sorted(runs.items()):
        for k, (_seed, curve) in enumerate(sorted(seeds.items())):
            xs, ys = zip(*curve, strict=True)
            ax.plot(xs, ys, color=colours.get(buffer), alpha=0.8,
                    label=labels.get(buffer, buffer) if k == 0 else None)
    ax.set_xlabel("frames collected")
    ax.set_ylabel(f"mean return of {TEST_EPISODES} greedy episodes")
    ax.set_title("TorchRL DQN, CartPole-v1, one line per seed")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", nargs="+", metavar="JSON",
                        help="plot these --out files into --png instead of training")
    parser.add_argument("--png", default="torchrl_dqn.png")
    parser.add_argument("--buffer", choices=["torchrl", "redisbuf", "redisbuf-slices"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--url")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        return
    if args.buffer is None:
        parser.error("--buffer is required (or --plot)")
    torch.set_num_threads(1)
    start = time.time()
    if args.buffer == "torchrl":
        curve = run_torchrl(args.frames, args.seed)
    else:
        curve = run_redisbuf(args.frames, args.seed, args.url,
                             slices=args.buffer == "redisbuf-slices")
    result = {"buffer": args.buffer, "seed": args.seed, "frames": args.frames,
              "seconds": time.time() - start, "curve": curve}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    main()

"""DI-engine's DQN example (``ding/example/dqn_per.py``: ``data_pusher`` and
``OffPolicyLearner`` on a ``DequeBuffer`` with ``PriorityExperienceReplay``, CartPole-v0),
with the buffer switched by its import, collector and learner in two processes.

Needs DI-engine 0.5.3 (``pip install DI-engine==0.5.3``: it pins ``numpy<2`` and
``gym==0.25.1``; redisbuf does not require it)::

    python -m redisbuf.examples.ding_dqn --buffer ding     --seed 0 --out a.json
    python -m redisbuf.examples.ding_dqn --buffer redisbuf --seed 0 --out b.json
    python -m redisbuf.examples.ding_dqn --plot a.json b.json --png ding_dqn.png

``--buffer ding`` runs DI-engine's example as it is: one process, its in-process
``ding.data.DequeBuffer``. ``--buffer redisbuf`` runs the same middleware with
``from redisbuf.ding import DequeBuffer, PriorityExperienceReplay`` in two processes
sharing the buffer by name: a collector (``eps_greedy_handler``, ``StepCollector``,
``data_pusher``) and a learner (``OffPolicyLearner``, ``interaction_evaluator``). The
learner publishes its model's weights every few iterations (a nest record in Redis:
tensors as raw bytes, no pickle) and the collector loads them; the learner trains
``update_per_collect`` batches per ``n_sample`` collected transitions, as the one
process does, waiting for the collector when ahead. Each run writes its evaluation
curve (episode return by env step) to ``--out``; ``--plot`` draws such files.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

#: Redis keys of the two-process run, besides the buffer's (under its tag)
_WEIGHTS, _VERSION, _ENV_STEP, _STOP = "weights", "weights_version", "env_step", "stop"


def _config(seed: int, exp_dir: str) -> tuple[Any, Any]:
    import copy

    from ding.config import compile_config
    from dizoo.classic_control.cartpole.config.cartpole_dqn_config import (
        create_config,
        main_config,
    )

    main = copy.deepcopy(main_config)
    main.exp_name = os.path.join(exp_dir, f"cartpole_dqn_per_seed{seed}")
    main.policy.priority = True
    main.policy.priority_IS_weight = True
    cfg = compile_config(main, create_cfg=create_config, auto=True, seed=seed,
                         save_cfg=False)
    return cfg, main


def _envs(cfg: Any, count: int) -> Any:
    import gym
    from ding.envs import BaseEnvManagerV2, DingEnvWrapper

    return BaseEnvManagerV2(
        env_fn=[lambda: DingEnvWrapper(gym.make("CartPole-v0")) for _ in range(count)],
        cfg=cfg.env.manager)


def _recorder(curve: list[dict[str, float]], started: float, env_step: Any = None) -> Any:
    """A middleware after the evaluator: one point per evaluation."""
    def record(ctx: Any) -> None:
        if ctx.last_eval_iter == ctx.train_iter and ctx.eval_value != -float("inf") and (
                not curve or curve[-1]["train_iter"] != ctx.train_iter):
            steps = ctx.env_step if env_step is None else env_step()
            curve.append({"train_iter": int(ctx.train_iter), "env_step": int(steps),
                          "return": float(ctx.eval_value),
                          "seconds": round(time.monotonic() - started, 2)})
    return record


def _stopper(max_env_steps: int, env_step: Any = None) -> Any:
    from ding.framework import task

    def stop(ctx: Any) -> None:
        if (ctx.env_step if env_step is None else env_step()) >= max_env_steps:
            task.finish = True
    return stop


def run_single(seed: int, max_env_steps: int, exp_dir: str) -> list[dict[str, float]]:
    """DI-engine's dqn_per.py as it is (one process, DI-engine's own DequeBuffer)."""
    from ding.data import DequeBuffer
    from ding.data.buffer.middleware import PriorityExperienceReplay
    from ding.framework import task
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware import (
        OffPolicyLearner,
        StepCollector,
        data_pusher,
        eps_greedy_handler,
        interaction_evaluator,
    )
    from ding.model import DQN
    from ding.policy import DQNPolicy
    from ding.utils import set_pkg_seed

    cfg, _ = _config(seed, exp_dir)
    curve: list[dict[str, float]] = []
    started = time.monotonic()
    with task.start(async_mode=False, ctx=OnlineRLContext()):
        collector_env = _envs(cfg, cfg.env.collector_env_num)
        evaluator_env = _envs(cfg, cfg.env.evaluator_env_num)
        set_pkg_seed(cfg.seed, use_cuda=cfg.policy.cuda)
        model = DQN(**cfg.policy.model)
        buffer_ = DequeBuffer(size=cfg.policy.other.replay_buffer.replay_buffer_size)
        buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))
        policy = DQNPolicy(cfg.policy, model=model)
        task.use(interaction_evaluator(cfg, policy.eval_mode, evaluator_env))
        task.use(_recorder(curve, started))
        task.use(eps_greedy_handler(cfg))
        task.use(StepCollector(cfg, policy.collect_mode, collector_env))
        task.use(data_pusher(cfg, buffer_))
        task.use(OffPolicyLearner(cfg, policy.learn_mode, buffer_))
        task.use(_stopper(max_env_steps))
        task.run()
    return curve


def _budget(cfg: Any, env_step: int) -> float:
    """The training iterations the one-process example has made by ``env_step``:
    ``update_per_collect`` per ``n_sample`` transitions (PER draws with replacement, so
    it trains from the first transitions on)."""
    return env_step * cfg.policy.learn.update_per_collect / cfg.policy.collect.n_sample


def _state_key(name: str, what: str) -> str:
    return f"ding-example:{{{name}}}:{what}"


def _publish_weights(client: Any, name: str, model: Any) -> None:
    from redisbuf.store.nest import encode_nest

    weights = {key: value.detach().clone() for key, value in model.state_dict().items()}
    pipe = client.pipeline()
    pipe.set(_state_key(name, _WEIGHTS), encode_nest(weights))
    pipe.incr(_state_key(name, _VERSION))
    pipe.execute()


def _collector(url: str, name: str, seed: int, exp_dir: str, max_env_steps: int) -> None:
    import redis
    import torch
    from ding.framework import task
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware import StepCollector, data_pusher, eps_greedy_handler
    from ding.model import DQN
    from ding.policy import DQNPolicy
    from ding.utils import set_pkg_seed

    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay
    from redisbuf.store.nest import decode_nest

    client: Any = redis.Redis.from_url(url)
    cfg, _ = _config(seed, exp_dir)
    loaded = [0]

    def follow(ctx: Any) -> None:
        """Load the learner's weights when it published new ones; stay at most a few
        collection steps ahead of its training (the one process's ratio)."""
        while not client.exists(_state_key(name, _STOP)):
            trained = int(client.get(_state_key(name, "train_iter")) or 0)
            if _budget(cfg, ctx.env_step) <= trained + 4 * cfg.policy.learn.update_per_collect:
                break
            time.sleep(0.005)
        version = int(client.get(_state_key(name, _VERSION)) or 0)
        blob = client.get(_state_key(name, _WEIGHTS)) if version > loaded[0] else None
        if blob is not None:
            model.load_state_dict({k: torch.as_tensor(v) for k, v in decode_nest(blob).items()})
            loaded[0] = version
        client.set(_state_key(name, _ENV_STEP), ctx.env_step)
        if client.exists(_state_key(name, _STOP)) or ctx.env_step >= max_env_steps:
            task.finish = True

    with task.start(async_mode=False, ctx=OnlineRLContext()):
        collector_env = _envs(cfg, cfg.env.collector_env_num)
        set_pkg_seed(cfg.seed, use_cuda=cfg.policy.cuda)
        model = DQN(**cfg.policy.model)
        buffer_ = DequeBuffer(size=cfg.policy.other.replay_buffer.replay_buffer_size,
                              url=url, name=name)
        buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))
        policy = DQNPolicy(cfg.policy, model=model, enable_field=["collect"])
        task.use(eps_greedy_handler(cfg))
        task.use(StepCollector(cfg, policy.collect_mode, collector_env))
        task.use(data_pusher(cfg, buffer_))
        task.use(follow)
        task.run()


def _learner(url: str, name: str, seed: int, exp_dir: str, max_env_steps: int,
             out: str) -> None:
    import redis
    from ding.framework import task
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware import OffPolicyLearner, interaction_evaluator
    from ding.model import DQN
    from ding.policy import DQNPolicy
    from ding.utils import set_pkg_seed

    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

    client: Any = redis.Redis.from_url(url)
    cfg, _ = _config(seed, exp_dir)
    curve: list[dict[str, float]] = []
    started = time.monotonic()

    def env_step() -> int:
        return int(client.get(_state_key(name, _ENV_STEP)) or 0)

    def pace(ctx: Any) -> Iterator[None]:
        """Train no faster than the one process does: update_per_collect batches per
        n_sample collected transitions; publish the weights now and then."""
        while _budget(cfg, env_step()) < ctx.train_iter + cfg.policy.learn.update_per_collect:
            if client.exists(_state_key(name, _STOP)):
                task.finish = True
                return
            time.sleep(0.005)
        ctx.env_step = env_step()
        yield
        client.set(_state_key(name, "train_iter"), ctx.train_iter)
        if ctx.train_iter % 20 < cfg.policy.learn.update_per_collect:
            _publish_weights(client, name, model)
        if env_step() >= max_env_steps:
            task.finish = True

    with task.start(async_mode=False, ctx=OnlineRLContext()):
        evaluator_env = _envs(cfg, cfg.env.evaluator_env_num)
        set_pkg_seed(cfg.seed, use_cuda=cfg.policy.cuda)
        model = DQN(**cfg.policy.model)
        buffer_ = DequeBuffer(size=cfg.policy.other.replay_buffer.replay_buffer_size,
                              url=url, name=name)
        buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))
        policy = DQNPolicy(cfg.policy, model=model, enable_field=["learn", "eval"])
        _publish_weights(client, name, model)
        task.use(interaction_evaluator(cfg, policy.eval_mode, evaluator_env))
        task.use(_recorder(curve, started, env_step))
        task.use(pace)
        task.use(OffPolicyLearner(cfg, policy.learn_mode, buffer_))
        task.run()
    client.set(_state_key(name, _STOP), 1)
    with open(out, "w") as f:
        json.dump(curve, f)


def run_two_processes(seed: int, max_env_steps: int, exp_dir: str,
                      url: str | None) -> list[dict[str, float]]:
    """The same middleware on redisbuf.ding, collector and learner in two processes."""
    import uuid

    from redisbuf.servers.embedded import default_url

    url = url or default_url()
    name = f"ding-dqn-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "curve.json")
        learner = ctx.Process(target=_learner,
                              args=(url, name, seed, exp_dir, max_env_steps, out))
        collector = ctx.Process(target=_collector, args=(url, name, seed, exp_dir, max_env_steps))
        learner.start()
        collector.start()
        learner.join()
        collector.join(timeout=120)
        if collector.is_alive():
            collector.terminate()
        if learner.exitcode != 0 or not os.path.exists(out):
            raise RuntimeError(f"the learner failed (exit code {learner.exitcode})")
        with open(out) as f:
            return json.load(f)


_LABELS = {"ding": "DI-engine DequeBuffer, one process",
           "redisbuf": "redisbuf.ding DequeBuffer, two processes"}


def plot(paths: list[str], png: str) -> None:
    """The curves (return by env step) of ``--out`` files, or of files holding several
    runs under ``"runs"`` (docs/ding_dqn.json), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            held = json.load(f)
        runs += held["runs"] if "runs" in held else [held]
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        points = run["curve"]
        ax.plot([p["env_step"] for p in points], [p["return"] for p in points],
                label=(f"{_LABELS[run['buffer']]}, seed {run['seed']}"),
                linestyle="-" if run["buffer"] == "redisbuf" else "--")
    ax.axhline(195, color="grey", linewidth=0.8)
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return (CartPole-v0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", nargs="+", metavar="JSON",
                        help="plot these --out files into --png instead of training")
    parser.add_argument("--png", default="ding_dqn.png")
    parser.add_argument("--buffer", choices=["ding", "redisbuf"], default="redisbuf")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-steps", type=int, default=30_000)
    parser.add_argument("--url", help="Redis URL (default: $REDISBUF_URL or a private server)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        return
    with tempfile.TemporaryDirectory() as exp_dir:
        started = time.monotonic()
        if args.buffer == "ding":
            curve = run_single(args.seed, args.env_steps, exp_dir)
        else:
            curve = run_two_processes(args.seed, args.env_steps, exp_dir, args.url)
    result = {"buffer": args.buffer, "seed": args.seed, "env_steps": args.env_steps,
              "seconds": round(time.monotonic() - started, 1), "curve": curve}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    main()

"""An Acme-style distributed DQN on gymnasium's CartPole-v1, written against Reverb's API.

    python -m redisbuf.examples.reverb_dqn [--actors 2] [--minutes 5] [--target 200]

The code is Reverb code: ``reverb.Server`` with a prioritized replay table (Prioritized
0.6 sampler, FIFO remover, a ``SampleToInsertRatio`` limiter, a signature) and a
one-item variables table; actor processes whose adder is ``client.trajectory_writer``
(each step appended, an n-step item of the last ``n + 1`` steps made with
``history[...]`` slices); a learner reading ``TrajectoryDataset.from_table_signature(...)
.batch(...).prefetch(...)`` as a numpy iterator, weighting its double-DQN loss by the
samples' probabilities (PER importance weights) and writing priorities back with
``client.mutate_priorities``; parameters published by ``client.insert`` into the
variables table and sampled by the actors. It runs on redisbuf because of one line::

    from redisbuf import reverb      # instead of: import reverb

``--backend reverb`` imports DeepMind's ``reverb`` instead (where dm-reverb installs:
Python <= 3.11 with TensorFlow 2.15), to compare the two on the same code.

The Q-network is a small numpy MLP trained with Adam (no torch, no TensorFlow), so the
example runs wherever the lean package does, Python 3.11 to 3.13. Actor ``i`` of ``N``
explores with Ape-X's ``eps_i = 0.4 ** (1 + 7 i / (N - 1))``; "return" is the mean over
the last 20 episodes of the greediest actor. The run stops at ``--target``, after
``--minutes`` or at Ctrl-C, and writes a JSON of the run and, with matplotlib, its curve
(``--out``); ``--plot A.json B.json --png OUT.png`` draws the curves of several runs
(Python 3.11 and 3.13, say) into one figure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing
import os
import queue
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ENV_ID = "CartPole-v1"
#: episodes of the greediest actor that make the "mean return"
WINDOW = 20
TABLE, VARIABLES = "priority_table", "variables"


def load_reverb(backend: str) -> Any:
    """``redisbuf.reverb`` (the default), or DeepMind's ``reverb``."""
    return importlib.import_module("reverb" if backend == "reverb" else "redisbuf.reverb")


@dataclass
class Config:
    actors: int = 2
    minutes: float = 5.0
    target: float = 200.0
    seed: int = 0
    n_step: int = 3
    gamma: float = 0.99
    batch_size: int = 64
    max_size: int = 20_000
    min_size: int = 500
    samples_per_insert: float = 8.0
    learning_rate: float = 1e-3
    target_every: int = 250
    publish_every: int = 25
    hidden: int = 64
    alpha: float = 0.6
    beta: float = 0.4
    backend: str = "redisbuf"


@dataclass
class Result:
    config: dict[str, Any]
    returns: list[tuple[float, int, float]] = field(default_factory=list)  # (s, actor, G)
    learner_steps: int = 0
    seconds: float = 0.0
    reached: float | None = None
    final_return: float = 0.0


# -- the Q-network ---------------------------------------------------------------------


def init_params(rng: np.random.Generator, hidden: int) -> dict[str, np.ndarray]:
    def layer(fan_in: int, fan_out: int) -> np.ndarray:
        return rng.uniform(-1, 1, (fan_in, fan_out)).astype(np.float32) / math.sqrt(fan_in)

    return {"w1": layer(4, hidden), "b1": np.zeros(hidden, np.float32),
            "w2": layer(hidden, hidden), "b2": np.zeros(hidden, np.float32),
            "w3": layer(hidden, 2), "b3": np.zeros(2, np.float32)}


def q_values(params: dict[str, np.ndarray], obs: np.ndarray) -> tuple[np.ndarray, tuple]:
    h1 = np.maximum(obs @ params["w1"] + params["b1"], 0.0)
    h2 = np.maximum(h1 @ params["w2"] + params["b2"], 0.0)
    return h2 @ params["w3"] + params["b3"], (obs, h1, h2)


def gradients(params: dict[str, np.ndarray], cache: tuple, dq: np.ndarray
              ) -> dict[str, np.ndarray]:
    obs, h1, h2 = cache
    grads = {"w3": h2.T @ dq, "b3": dq.sum(0)}
    d2 = (dq @ params["w3"].T) * (h2 > 0)
    grads["w2"], grads["b2"] = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ params["w2"].T) * (h1 > 0)
    grads["w1"], grads["b1"] = obs.T @ d1, d1.sum(0)
    return grads


class Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            m = self.m[k] / (1 - 0.9 ** self.t)
            v = self.v[k] / (1 - 0.999 ** self.t)
            params[k] -= (self.lr * m / (np.sqrt(v) + 1e-8)).astype(np.float32)


# -- the server --------------------------------------------------------------------------


def make_server(reverb: Any, config: Config) -> Any:
    """A replay table (prioritized, FIFO remover, sample-to-insert ratio, a signature)
    and a one-item table the learner publishes its parameters in."""
    n = config.n_step
    spec = getattr(reverb, "TensorSpec", None) or _tf_spec  # DeepMind's needs tf's
    signature = {
        "observation": spec([4], np.float32),
        "action": spec([], np.int64),
        "rewards": spec([n], np.float32),
        "discounts": spec([n], np.float32),
        "next_observation": spec([4], np.float32),
    }
    replay = reverb.Table(
        name=TABLE,
        sampler=reverb.selectors.Prioritized(config.alpha),
        remover=reverb.selectors.Fifo(),
        max_size=config.max_size,
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=config.samples_per_insert,
            min_size_to_sample=config.min_size,
            error_buffer=config.samples_per_insert * config.min_size * 4),
        signature=signature,
    )
    variables = reverb.Table(
        name=VARIABLES, sampler=reverb.selectors.Fifo(), remover=reverb.selectors.Fifo(),
        max_size=1, rate_limiter=reverb.rate_limiters.MinSize(1))
    return reverb.Server(tables=[replay, variables])


def _tf_spec(shape: list[int], dtype: Any) -> Any:
    tf = importlib.import_module("tensorflow")  # DeepMind's Reverb only
    return tf.TensorSpec(shape, tf.as_dtype(dtype))


# -- actors ------------------------------------------------------------------------------


def actor_epsilon(index: int, count: int) -> float:
    return 0.4 ** (1 + 7 * index / (count - 1)) if count > 1 else 0.4


def run_actor(index: int, address: str, config: dict[str, Any], returns: Any,
              stop: Any) -> None:
    """One actor process: plays, writes n-step items, fetches parameters."""
    import gymnasium as gym

    cfg = Config(**config)
    reverb = load_reverb(cfg.backend)
    client = reverb.Client(address)
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(cfg.seed * 1000 + index)
    epsilon = actor_epsilon(index, cfg.actors)
    params = init_params(np.random.default_rng(cfg.seed), cfg.hidden)
    n = cfg.n_step
    pad = {"observation": np.zeros(4, np.float32), "action": np.int64(0),
           "reward": np.float32(0.0), "discount": np.float32(0.0)}

    def item(writer: Any) -> None:
        history = writer.history
        writer.create_item(TABLE, priority=1.0, trajectory={
            "observation": history["observation"][-(n + 1)],
            "action": history["action"][-(n + 1)],
            "rewards": history["reward"][-(n + 1):-1],
            "discounts": history["discount"][-(n + 1):-1],
            "next_observation": history["observation"][-1],
        })

    episode = 0
    steps = 0
    with client.trajectory_writer(num_keep_alive_refs=n + 1) as writer:
        while not stop.is_set():
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            done, total = False, 0.0
            while not done and not stop.is_set():
                if rng.random() < epsilon:
                    action = int(rng.integers(2))
                else:
                    action = int(np.argmax(q_values(params, obs[None].astype(np.float32))[0]))
                next_obs, reward, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
                total += float(reward)
                writer.append({"observation": obs.astype(np.float32), "action": np.int64(action),
                               "reward": np.float32(reward),
                               "discount": np.float32(0.0 if terminated else 1.0)})
                if writer.episode_steps >= n + 1:
                    item(writer)
                obs = next_obs
                steps += 1
                if steps % 100 == 0:
                    params = _fetch(client, params)
                _flush(writer, stop)
            # the last observation, then padding so every step starts an item
            writer.append({**pad, "observation": obs.astype(np.float32)})
            for _ in range(n):
                if writer.episode_steps >= n + 1:
                    item(writer)
                writer.append(pad)
            _end_episode(writer, stop)
            episode += 1
            returns.put((time.time(), index, total))


def _flush(writer: Any, stop: Any) -> None:
    """Wait for the table to take what was written (its rate limiter may hold it), a
    second at a time so a stop is seen."""
    while not stop.is_set():
        try:
            writer.flush(block_until_num_items=8, timeout_ms=1000)
            return
        except Exception as exc:  # DeadlineExceededError of either backend
            if "Deadline" not in type(exc).__name__:
                raise


def _end_episode(writer: Any, stop: Any) -> None:
    while not stop.is_set():
        try:
            writer.end_episode(timeout_ms=1000)
            return
        except Exception as exc:
            if "Deadline" not in type(exc).__name__:
                raise
            # the episode is new anyway; wait for the rest with flush
            _flush(writer, stop)
            return


def _fetch(client: Any, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The newest parameters the learner published (or ``params`` before any)."""
    info = client.server_info()[VARIABLES]
    if info.current_size == 0:
        return params
    sample = next(client.sample(VARIABLES, 1, emit_timesteps=False,
                                unpack_as_table_signature=False))
    names = sorted(params)
    return {name: np.asarray(value[0], np.float32) for name, value in
            zip(names, sample.data, strict=True)}


# -- the learner -------------------------------------------------------------------------


def n_step_targets(rewards: np.ndarray, discounts: np.ndarray, gamma: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each item's n-step return ``sum_k gamma^k r_k`` over its steps up to the one that
    ended its episode (a discount of 0: terminal), and the factor of its bootstrap value
    (``gamma^n`` when no step ended it, else 0)."""
    n = rewards.shape[1]
    gammas = (gamma ** np.arange(n)).astype(np.float32)
    alive = np.cumprod(np.concatenate(
        [np.ones((len(rewards), 1), np.float32), discounts[:, :-1]], 1), 1)
    returns = (rewards * alive * gammas).sum(1)
    return returns, (gamma ** n) * alive[:, -1] * discounts[:, -1]


def run_learner(address: str, config: dict[str, Any], progress: Any, stop: Any) -> None:
    cfg = Config(**config)
    reverb = load_reverb(cfg.backend)
    client = reverb.Client(address)
    rng = np.random.default_rng(cfg.seed)
    params = init_params(rng, cfg.hidden)
    target = {k: v.copy() for k, v in params.items()}
    adam = Adam(params, cfg.learning_rate)
    client.insert([params[k] for k in sorted(params)], priorities={VARIABLES: 1.0})
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=address, table=TABLE,
        max_in_flight_samples_per_worker=2 * cfg.batch_size,
        rate_limiter_timeout_ms=1000,
    ).batch(cfg.batch_size, drop_remainder=True).prefetch(2)
    steps = 0
    while not stop.is_set():
        for sample in dataset.as_numpy_iterator():  # ends when the limiter times out
            data, info = sample.data, sample.info
            returns, bootstrap = n_step_targets(data["rewards"], data["discounts"], cfg.gamma)
            rows = np.arange(len(info.key))
            next_q, _ = q_values(params, data["next_observation"])  # double DQN
            next_target, _ = q_values(target, data["next_observation"])
            y = returns + bootstrap * next_target[rows, next_q.argmax(1)]
            q, cache = q_values(params, data["observation"])
            chosen = q[rows, data["action"]]
            td = chosen - y
            size = max(int(np.max(info.table_size)), 1)
            weights = (size * info.probability) ** -cfg.beta
            weights = (weights / weights.max()).astype(np.float32)
            huber = np.clip(td, -1.0, 1.0)  # d(Huber)/dq
            dq = np.zeros_like(q)
            dq[rows, data["action"]] = weights * huber / len(y)
            adam.step(params, gradients(params, cache, dq))
            client.mutate_priorities(TABLE, updates=dict(zip(
                info.key.tolist(), (np.abs(td) + 1e-3).tolist(), strict=True)))
            steps += 1
            if steps % cfg.target_every == 0:
                target = {k: v.copy() for k, v in params.items()}
            if steps % cfg.publish_every == 0:
                client.insert([params[k] for k in sorted(params)], priorities={VARIABLES: 1.0})
                progress.put(("steps", steps))
            if stop.is_set():
                break
    progress.put(("steps", steps))


# -- the run -----------------------------------------------------------------------------


def run(config: Config, log: Any = print) -> Result:
    """Start the server, the learner and the actors; stop at the target, the time limit
    or Ctrl-C."""
    reverb = load_reverb(config.backend)
    server = make_server(reverb, config)
    address = f"localhost:{server.port}"
    context = multiprocessing.get_context("spawn")
    stop, returns = context.Event(), context.Queue()
    settings = asdict(config)
    learner = context.Process(target=run_learner, args=(address, settings, returns, stop),
                              daemon=True)
    actors = [context.Process(target=run_actor, args=(i, address, settings, returns, stop),
                              daemon=True) for i in range(config.actors)]
    result = Result(settings)
    start = time.time()
    learner.start()
    for actor in actors:
        actor.start()
    greedy = config.actors - 1
    recent: list[float] = []
    try:
        while time.time() - start < config.minutes * 60:
            try:
                message = returns.get(timeout=1.0)
            except queue.Empty:
                if not learner.is_alive():
                    raise RuntimeError("the learner died") from None
                continue
            if message[0] == "steps":
                result.learner_steps = int(message[1])
                continue
            when, index, total = message
            result.returns.append((when - start, int(index), float(total)))
            if index == greedy:
                recent = (recent + [total])[-WINDOW:]
                if len(recent) == WINDOW:
                    mean = float(np.mean(recent))
                    log(f"{when - start:6.1f} s  learner steps {result.learner_steps:6d}  "
                        f"mean return {mean:6.1f}")
                    if config.target and mean >= config.target:
                        result.reached = when - start
                        break
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        stop.set()
        for process in [learner, *actors]:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
        server.stop()
    result.seconds = time.time() - start
    result.final_return = float(np.mean(recent)) if recent else 0.0
    return result


def report(result: Result, date: str, load_before: list[float], command: list[str]
           ) -> dict[str, Any]:
    """The run as JSON data, in the layout benchmarks/publish_example.py reads (one run
    of one seed): the time and frames to the target, frames and learner steps per second,
    and every episode's (time, actor, return)."""
    frames_to_target = None
    frames = sum(total for _, _, total in result.returns)  # CartPole: 1 per frame
    if result.reached is not None:
        frames_to_target = sum(total for when, _, total in result.returns
                               if when <= result.reached)
    run_ = {"seed": result.config["seed"], "time_to_target": result.reached,
            "frames_to_target": frames_to_target,
            "frames_per_s": frames / result.seconds if result.seconds else None,
            "learner_steps": result.learner_steps,
            "learner_steps_per_s": (result.learner_steps / result.seconds
                                    if result.seconds else None),
            "final_return": result.final_return,
            "python": "{}.{}.{}".format(*sys.version_info[:3]), "returns": result.returns}
    return {"date": date, "load": {"before": load_before, "after": list(os.getloadavg())},
            "command": command, "config": result.config, "runs": [run_]}


def plot(reports: list[dict[str, Any]], path: Path) -> None:
    """Draw the greediest actor's returns (the mean of the last ``WINDOW`` episodes) of
    each run of these reports (as :func:`report` writes them), one curve per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for document in reports:
        config = document["config"]
        greedy = config["actors"] - 1
        for run_ in document["runs"]:
            points = [(t, g) for t, i, g in run_["returns"] if i == greedy]
            if not points:
                continue
            times, values = zip(*points, strict=True)
            smooth = [float(np.mean(values[max(0, k - WINDOW + 1): k + 1]))
                      for k in range(len(values))]
            label = f"{config['backend']}, Python {run_.get('python', '?')}, seed {run_['seed']}"
            ax.plot(times, smooth, label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel(f"return (mean of the last {WINDOW})")
    ax.set_title(f"DQN on {ENV_ID} through Reverb's API")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--target", type=float, default=200.0,
                        help="stop when the mean return reaches this (0: never)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["redisbuf", "reverb"], default="redisbuf")
    parser.add_argument("--out", default="reverb_dqn", help="prefix of the JSON and PNG")
    parser.add_argument("--plot", nargs="+", metavar="JSON",
                        help="draw the curves of these --out JSON files into --png instead "
                             "of training")
    parser.add_argument("--png", default="reverb_dqn.png", help="the PNG that --plot draws")
    args = parser.parse_args(argv)
    if args.plot:
        plot([json.loads(Path(name).read_text()) for name in args.plot], Path(args.png))
        return 0
    config = Config(actors=args.actors, minutes=args.minutes, target=args.target,
                    seed=args.seed, backend=args.backend)
    load_before = list(os.getloadavg())
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result = run(config)
    out = Path(args.out)
    python = "python{}.{}".format(*sys.version_info[:2])
    document = report(result, date, load_before, [
        python, "-m", "redisbuf.examples.reverb_dqn",
        *(argv if argv is not None else sys.argv[1:])])
    out.with_suffix(".json").write_text(json.dumps(document, indent=1))
    try:
        plot([document], out.with_suffix(".png"))
    except ImportError:  # no matplotlib: --plot draws the JSON elsewhere
        pass
    print(f"mean return {result.final_return:.1f} after {result.seconds:.0f} s, "
          f"{result.learner_steps} learner steps")
    return 0 if (not config.target or result.reached is not None) else 1


if __name__ == "__main__":
    raise SystemExit(main())

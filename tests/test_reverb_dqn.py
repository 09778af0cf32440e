"""The Acme-style DQN example written against Reverb's API
(redisbuf/examples/reverb_dqn.py): its n-step targets, its numpy Q-network's gradients,
and a bounded run on CartPole that must learn through redisbuf.reverb."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from redisbuf.examples.reverb_dqn import (  # noqa: E402
    Config,
    gradients,
    init_params,
    n_step_targets,
    q_values,
    run,
)

# A random policy averages about 22 on CartPole-v1; the run below (2 actors, seed 0)
# passed 150 within a minute on a loaded 2-core machine.
LEARNED = 100.0


def test_n_step_targets_stop_at_the_terminal_step():
    rewards = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 0.0, 0.0]], np.float32)
    discounts = np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    returns, bootstrap = n_step_targets(rewards, discounts, 0.5)
    np.testing.assert_allclose(returns, [1.75, 1.5, 2.0])
    np.testing.assert_allclose(bootstrap, [0.125, 0.0, 0.0])


def test_the_q_network_gradients_are_those_of_its_output():
    rng = np.random.default_rng(0)
    params = {k: v.astype(np.float64) for k, v in init_params(rng, 8).items()}
    obs = rng.standard_normal((5, 4))
    weights = rng.standard_normal((5, 2))

    def loss(p):
        return float((q_values(p, obs)[0] * weights).sum())

    _, cache = q_values(params, obs)
    grads = gradients(params, cache, weights)
    for name in ("w1", "b2", "w3"):
        index = (0,) * params[name].ndim
        bumped = {k: v.copy() for k, v in params.items()}
        bumped[name][index] += 1e-6
        numeric = (loss(bumped) - loss(params)) / 1e-6
        assert grads[name][index] == pytest.approx(numeric, rel=1e-3, abs=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_dqn_on_reverbs_api_learns_cartpole():
    result = run(Config(actors=2, minutes=4.0, target=LEARNED, seed=0), log=lambda _: None)
    assert result.reached is not None, (result.final_return, result.learner_steps)
    assert result.learner_steps > 0
    greedy = [g for _, i, g in result.returns if i == 1]
    assert np.mean(greedy[:20]) < LEARNED <= result.final_return


def test_a_run_report_carries_its_python_and_plots_from_json(tmp_path):
    import json
    import sys
    from dataclasses import asdict

    from redisbuf.examples.reverb_dqn import Result, main, report

    pytest.importorskip("matplotlib")
    result = Result(config=asdict(Config(actors=2)),
                    returns=[(1.0, 1, 20.0), (2.0, 0, 9.0), (3.0, 1, 40.0)],
                    learner_steps=10, seconds=4.0, reached=3.0, final_return=30.0)
    document = report(result, "2026-01-01 00:00 UTC", [1.0, 1.0, 1.0], ["python"])
    (run_,) = document["runs"]
    assert run_["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert run_["frames_to_target"] == 69 and run_["time_to_target"] == 3.0
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    png = tmp_path / "both.png"
    assert main(["--plot", str(path), str(path), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

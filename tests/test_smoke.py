import numpy as np

from redisbuf import ReplayBuffer


def test_add_then_sample_round_trips_a_dict_batch(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    obs = np.arange(8, dtype=np.float32).reshape(4, 2)
    buffer.add({"obs": obs, "log_rewards": np.arange(4.0)})
    out = buffer.sample(4)
    assert sorted(out["obs"][:, 0].tolist()) == [0.0, 2.0, 4.0, 6.0]

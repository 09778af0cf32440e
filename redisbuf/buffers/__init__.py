"""Buffer kinds, one class per module: the replay buffer and its checkpoints, the sharded
buffer, per-environment sequences, episodes, fragments, and torchgfn's two derived buffers."""

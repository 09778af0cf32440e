"""What is drawn, when and how often: samplers, their replicas of the scores, windows,
rate limiters, data lifetime, waiting for a buffer to change, and the prefetching reader."""

"""Operating a buffer: Prometheus metrics and rate history, per-buffer ACL roles."""

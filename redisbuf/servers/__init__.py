"""Servers redisbuf starts: the embedded server (and its watchdog) and a local cluster."""

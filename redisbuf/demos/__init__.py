"""What ``redisbuf demo`` runs: worker processes sharing one buffer, or a manager that
scores what its workers add."""

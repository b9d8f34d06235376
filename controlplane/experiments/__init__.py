"""Tasks, experiments, runs, rounds, assignments and checkpoints: the FL side of the state."""

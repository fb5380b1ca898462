"""Training: the SFT warm start, the RL loop (wiring of the stages), evaluation, checkpoints."""

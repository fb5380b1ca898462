"""Shared test settings."""

import torch

# One intra-op thread: on a loaded 2-core machine, two threads of tiny matmuls contend badly
# (a forward pass of the tiny model went from ~1.5 ms to ~270 ms); one thread is also deterministic.
torch.set_num_threads(1)

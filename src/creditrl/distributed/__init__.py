"""Scale-out on engines the field already runs: Ray actors for rollout and scoring
(:mod:`creditrl.distributed.ray_backend`) and a data-parallel learner on torch.distributed
(:mod:`creditrl.distributed.ddp`). The default backend stays one in-process loop."""

"""The override lists of the tests' small RL runs, kept in one place so that the runs stay alike.

On the test path through ``pythonpath = ["tests"]`` (pyproject.toml): ``from small_runs import ...``.
"""

# four prompts x four samples of 1-2 operations on operands 1-3, evaluated every 2 iterations
TINY_RUN = [
    "train.init=policy",
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "train.eval_size=4",
    "train.progress=false",
    "train.threads=1",
    "train.eval_every=2",
]

# two prompts x two samples: runs whose point is the model or the outputs, not the learning
MINI_RUN = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "train.eval_size=4",
    "train.progress=false",
    "train.threads=1",
]

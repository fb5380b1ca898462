"""One-off studies: measurements the grid engine (``creditrl compare`` / ``creditrl findings``)
cannot express, each a script run from the repository root that writes a run directory and,
with ``--results PAGE``, a results page under ``docs/results/``:

- ``python -m studies.values``: value estimates (tree, Monte-Carlo K, critic, dual critic)
  against the true step values;
- ``python -m studies.prm``: the PRM life cycle (labelers, step AUROC, MC labels, best-of-N, RL
  with the PRM) -> ``docs/results/prm.md``;
- ``python -m studies.search``: every test-time search method, accuracy against generated
  tokens -> ``docs/results/search.md``;
- ``python -m studies.long_outputs``: the chain task's SFT start per response length ->
  ``docs/results/long_outputs.md``;
- ``python -m studies.scheduled_sampling``: plain SFT against scheduled sampling, as exposure
  bias and as RL starts -> ``docs/results/scheduled_sampling.md``.

They share :mod:`studies.common` (their config, task and page writer) and the report arguments
of :func:`creditrl.cli.common.add_report_args`. Tree rollouts against GRPO is a grid:
``creditrl compare grids/c7_arith_tree.yaml`` (finding C7-arith).
"""

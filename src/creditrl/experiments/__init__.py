"""Experiments: the demo comparison, summaries, reports and plots."""

"""Evaluation on a fixed test set, shared by both products (``evaluate``): episode records played by the library's
episode runner, per-seed metrics, per-problem bootstrap intervals, tables and plots. It depends on neither product:
the meta-policy CLI is ``python -m baselines.meta.evaluate``.
"""

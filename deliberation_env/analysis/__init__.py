"""Analysis of recorded runs: what real episodes did, the simulator fitted to them, and how faithful it is.

- ``traces``: episode traces, one JSON line per finished episode (``parallel_env(trace=...)``), and a strict reader;
- ``calibrate``: fit ``SimConfig`` to traces (``python -m deliberation_env.analysis.calibrate``);
- ``fidelity``: replay held-out traced episodes on a fitted sim and report real vs sim;
- ``metrics``: the small statistics they share with evaluation and the bench scripts (AUROC, Spearman,
  Wilson and bootstrap intervals).
"""

"""Other projects' multi-agent RL libraries trained on the benchmark, scored by our exact evaluator.

Each lives in a module of its own behind an optional extra, since their pins can clash with the dev extra's:
``benchmarl_task`` (BenchMARL 1.5.2, ``pip install -e '.[benchmarl]'`` in a virtualenv of its own). docs/peers.md.
"""

"""The measurement scripts (``benchmark/``, ``studies/``) and the helpers they share (``common/``): a package, so that a
script imports its helpers as ``bench.common.results``, ... and tests import scripts as ``bench.<folder>.<script>``."""

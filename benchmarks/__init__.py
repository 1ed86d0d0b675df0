"""Performance benchmarks: ``python -m benchmarks [name]`` (``./run bench [name]``).

Figures go to ``benchmarks/RESULTS.md``; large generated inputs to ``benchmarks/data/``
(git-ignored).
"""

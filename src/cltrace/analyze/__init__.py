"""Analyze: reports built from spans, in memory or read from a file.

One module per question (``report``: the region tree; ``summary``: a file's statistics).
May import ``read``, ``record`` and ``timeline``.
"""

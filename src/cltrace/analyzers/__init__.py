"""The analyzers: where the time went, from spans in memory or read from a file.

One module per question, after Holistic Trace Analysis: ``model`` (the trace as columns),
``window`` (the part of the run every question is about, applied first: steps, a time range, a
region, the steady state),
``utilisation`` (busy/idle per device and queue, idle causes), ``kernels`` (the kernel table),
``launches`` (enqueue against device time, queue depth), ``regions`` and ``report`` (the region
tree), ``findings/`` (rules with evidence and advice), ``diff`` (two runs), ``render``/``text``
(terminal output), ``plot`` (matplotlib, optional); ``analysis`` is the facade (``cltrace.analyze``).
May import ``read``, ``record`` and ``timeline``.
"""

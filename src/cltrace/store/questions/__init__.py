"""The store's questions, one module each, as SQL run inside ClickHouse: ``ranks`` (per-rank time and
device utilisation), ``kernels`` (kernel table and pace across ranks), ``regions`` (region totals),
``stragglers`` (per step, the ranks slower than the median, and why), ``findings`` (the file
analysis's rules that SQL can judge, per rank, with the ranks they hit). ``common`` holds what every
question reads the same way: which rank and run a row belongs to, its category, its device time.
They read only the collector exporter's columns, so rows any OTLP collector wrote answer them too."""

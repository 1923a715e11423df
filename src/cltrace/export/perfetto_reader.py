"""Where ``load_pftrace`` and ``iter_packets`` were imported from before ``cltrace.export.perfetto``
became a package; kept so that existing imports keep working."""
from .perfetto.reader import iter_packets, load_pftrace

__all__ = ["iter_packets", "load_pftrace"]

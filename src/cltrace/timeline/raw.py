"""The raw record: what the hot path appends for every span, and the one place its layout is named.

A record is a plain 15-tuple (the hot path builds nothing else: a tuple display is the cheapest object
Python makes), written positionally where it is built (``record/regions.py``, ``record/step_span.py``,
``record/timing.py``, ``programs/build.py``, ``capture/instrument.py``; in C, ``record/_region.c``) and read by these names
everywhere else (the recorder, ``stamps``, ``resolve``). The fields, in order:

- ``R_CAT``, ``R_NAME``: category and name (str)
- ``R_ID``, ``R_PARENT``: span id and its parent's (0: none)
- ``R_PATH``: the tuple of names from the root region down to this span's parent
- ``R_THREAD``: the recording thread's key (``tracks.COMPILE_THREAD`` for compile work, -1: none)
- ``R_HB``, ``R_HE``: host begin and end, ``perf_counter_ns``
- ``R_QUEUE``: the command queue (None: host-only)
- ``R_EV0``, ``R_EV1``: the command's event (or the reaper's ticket) and a region's second marker (or None)
- ``R_ATTRS``: attributes (dict or None)
- ``R_STATUS``, ``R_ERROR``: error status and message (None, None: ok)
- ``R_SITE``: the raw call-site capture (``record/callsite.py``: code objects and offsets, or None);
  the resolver looks its lines up

Read a field of many records with ``operator.itemgetter(R_X)``; where a loop indexes records, bind the
names it uses to locals first (a global costs a dict lookup per use, a local the same as a literal).
"""
from __future__ import annotations

(R_CAT, R_NAME, R_ID, R_PARENT, R_PATH, R_THREAD, R_HB, R_HE, R_QUEUE, R_EV0, R_EV1, R_ATTRS, R_STATUS, R_ERROR,
 R_SITE) = range(15)
R_FIELDS = 15  # fields in a record

__all__ = ["R_CAT", "R_NAME", "R_ID", "R_PARENT", "R_PATH", "R_THREAD", "R_HB", "R_HE", "R_QUEUE", "R_EV0",
           "R_EV1", "R_ATTRS", "R_STATUS", "R_ERROR", "R_SITE", "R_FIELDS"]

"""Timeline: raw records become spans on the host clock.

Device stamps are mapped through per-device clock calibrations (``clock``), spans are placed on
tracks (``tracks``) and aggregated (``stats``). Imports only ``cltrace.errors`` and ``cltrace._state``.
"""

"""Record: the hot path. Regions and launches append raw records; the recorder hands them to the timeline.

Also the queues cltrace measures with and the device-event timers (``timing``, ``EventTimer``,
``LaunchProfile``). May import ``timeline`` and the top-level ``errors``/``_state``/``_version``.
"""

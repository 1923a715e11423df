"""Capture: switching tracing on and off and attaching outputs (files by path, sinks).

May import ``export``, ``record`` and ``timeline``.
"""

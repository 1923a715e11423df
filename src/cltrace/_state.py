"""The module flags every hot path reads first. Nothing else lives here."""

ENABLED = False  # tracing on
INSTRUMENTED = False  # pyopencl hooks installed (cltrace.instrument): they record launches themselves
PROJECT_REGIONS = False  # regions on a queue project their device span from their commands (record/regions.py)

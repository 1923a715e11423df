"""The one module flag every hot path reads first. Nothing else lives here."""

ENABLED = False

"""``python -m cltrace ...`` is the ``cltrace`` command."""
import sys

from .cli import main

sys.exit(main())

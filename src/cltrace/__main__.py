"""``python -m cltrace ...`` is the ``cltrace`` command."""
import sys

from .cli.commands import main

sys.exit(main())

"""``python -m redisbuf``: the ``redisbuf`` command."""

import sys

from .cli import main

sys.exit(main())

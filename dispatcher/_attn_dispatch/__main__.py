"""``python -m attn_dispatch ...``: the ``attn-dispatch`` command line."""

import sys

from attn_dispatch.dispatcher.cli import main

sys.exit(main())

"""``python -m malletrain ...``: the ``malletrain`` command (malletrain.cli)."""

import sys

from malletrain.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""Entry point for `python -m d3`."""

import sys

from d3.cli import main

if __name__ == "__main__":
    sys.exit(main())

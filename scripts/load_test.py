"""Load test of the running app; the test itself is the package explorer/loadtest (see its docstring).

Usage: python scripts/load_test.py [--model smollm2-135m | --tiny] [--clients 8] [--tokens 16] [--runs 200] ...
       (the same as `python -m explorer.loadtest ...`)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explorer.loadtest.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

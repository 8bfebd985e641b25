"""``python -m nonstop ...`` (also ``torchrun ... -m nonstop serve --tp 2 --ep 4 ...``): the CLI."""

import sys

from nonstop.cli import main

if __name__ == "__main__":
    sys.exit(main())

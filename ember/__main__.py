"""``python -m ember ...`` is the ``ember`` command (ember/cli.py)."""
import sys

from ember.cli import main

if __name__ == "__main__":
    sys.exit(main())

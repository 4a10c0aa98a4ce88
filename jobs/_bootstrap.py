"""Make ``fedray`` importable when a job runs from a submitted working directory (``ray job
submit --working-dir .``) where the package is not installed: the repository root is the
parent of ``jobs/``."""

import os
import sys

try:
    import fedray  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

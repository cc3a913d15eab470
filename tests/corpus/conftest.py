import os
import sys

# Make the repository importable when pytest is run without installing ember. Appended, not
# prepended, so an explicitly configured PYTHONPATH / installed ember takes precedence.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

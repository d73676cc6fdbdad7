"""mHC family: kernels (pre.py, post.py, head.py), host ops (ops.py), torch references (reference.py),
and its registration (family.py)."""
from .family import FAMILY  # noqa: F401  (registers the family)

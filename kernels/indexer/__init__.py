"""Lightning-indexer family: kernels (logits.py, topk.py, swa.py), host ops (ops.py), torch references (reference.py),
and its registration (family.py)."""
from .family import FAMILY  # noqa: F401  (registers the family)

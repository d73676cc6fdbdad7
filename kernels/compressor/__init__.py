"""The KV compressor family (gated pooling into the compressed KV and index-K caches)."""
from . import family  # noqa: F401  (registers the family)

from .family import FAMILY  # noqa: F401  (registers the attention family)

from .family import FAMILY  # noqa: F401

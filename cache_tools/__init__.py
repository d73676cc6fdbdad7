"""Persistent, content-addressed artifact cache for compiled kernels (installed as dsv4_jit.cache_tools).

    from dsv4_jit.cache_tools import Store, compute_key
    store = Store()                                  # $DSV4_JIT_CACHE_DIR or the user cache dir
    entry = store.get_or_build(key, fields, build)   # build(staging_dir) -> extra dict | None
    entry.files["kernel.so"]                         # absolute path of the blob to load
"""
from .errors import BundleError, CacheError, CacheSecurityError, CacheWarning, KeyFieldError
from .keys import check_key_fields, compute_key
from .store import Entry, Store, default_cache_dir

__all__ = ["Store", "Entry", "compute_key", "check_key_fields", "default_cache_dir", "CacheError",
           "CacheSecurityError", "KeyFieldError", "BundleError", "CacheWarning",
           "export_bundle", "import_bundle"]


def __getattr__(name: str):
    # bundle pulls in tarfile/lzma; import it only when used.
    if name in ("export_bundle", "import_bundle"):
        from . import bundle
        return getattr(bundle, name)
    raise AttributeError(name)

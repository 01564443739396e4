"""Object-store access shared by the driver and the actors (torch-free, Ray-free): the one
retry policy every object-store call chorus makes goes through (retry.py: which errors are
transient, bounded exponential backoff with jitter, the error a permanent failure raises), and
the filesystem that applies it to every pyarrow call on a URI (filesystem.py).

One of actors/'s leaves (its __init__ draws the layers): it imports other leaves only, never
the engine, the codec, quality/ or synth/."""

from .filesystem import open_uri, unwrap
from .retry import RetryPolicy, StoreError, classify, give_up_by, retries_spent, retrying

__all__ = ["RetryPolicy", "StoreError", "classify", "give_up_by", "open_uri", "retries_spent", "retrying", "unwrap"]

"""The model loader (moved from retrctl/models.py; split into modules in the next commit)."""

from retrctl.models.encoder import (  # noqa: F401
    DTYPES,
    POOLING,
    SHIPPED,
    Encoder,
    EncoderConfig,
    cache_dir,
    ensure_pad_token,
    gguf_to_hf,
    is_decoder,
    locate_shipped,
    pad_ids,
    pool,
    resolve,
    stdout_to_stderr,
)

"""prefixpin's I/O shell: the ASGI app, upstream forwarding, the store, metrics, CLI."""

"""Named models: the registry (what, where from, checksums, the cache folder), pulling them from PyPI or the Hub,
and the default model shipped with tfgen (`default_model`).

May import `tfgen.models` (the Hub file patterns), `tfgen.text` and `tfgen.generation.compile_cache` (the cache root).
"""

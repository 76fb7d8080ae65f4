"""`generate()` for any model following the cache protocol: the mixin (`mixin`), the compiled programs and their
cache (`programs`), XLA's persistent compile cache on disk (`compile_cache`, its entries' checks in
`cache_entries`), output objects (`outputs`) and streamers (`streaming`).

May import `tfgen.request` and everything below it.
"""

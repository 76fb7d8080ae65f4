"""The request layer: one generate call resolved and checked before anything compiles.

    config ⊕ options → GenerationConfig.validate() → input checks → buckets → DecodeSpec (the program key)
                                                                           + DecodeInputs (tensors)

`prepare` (the request as a whole), `input_checks` (prompt, mask, lengths, seed), `encoder` (an encoder-decoder
call's encoder input and decoder prompt), `size` (the up-front memory check of a request).

May import `tfgen.decoding` and everything below it (`logits`, `stopping`, `structured`, `text`, `config`).
"""

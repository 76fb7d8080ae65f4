"""The decoding loops: one compiled program per static key, pure TF functions of (model, inputs, static options).

`loop` (the loop contract, `DecodeSpec`, the driver), `state` (the loop inputs and token state, the prefill, the
shared steps), the strategies (`sampling`, `beam`, `group_beam`, `contrastive`, `constrained_beam`, `speculative`
with `drafters`), what each can do (`strategies`, the one table of modes), beam bookkeeping (`beam_hypotheses`,
`constraints`, `constraint_states`), Philox sampling keys (`random`), `transition_scores`, and the model protocol the
loops call (`model_protocol`).

May import `tfgen.logits`, `tfgen.stopping`, `tfgen.config` and the leaf utilities.
"""

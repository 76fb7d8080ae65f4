"""Continuous batching: the slot programs (`slot_programs`: JetStream's prefill / insert / generate split over a
typed decode state) and the scheduler thread that drives them (`scheduler`).

May import `tfgen.decoding`, `tfgen.logits`, `tfgen.stopping`, `tfgen.config` and the leaf utilities.
"""

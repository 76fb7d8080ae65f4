"""Continuous batching: the slot programs (`slot_programs`) and the scheduler that drives them (`scheduler`)."""

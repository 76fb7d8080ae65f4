"""Decoding loops: pure functions of (model, inputs, static options) that trace into one XLA program."""

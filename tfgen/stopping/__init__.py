"""When a row stops besides eos and its budget: stopping criteria (HF's names, `criteria`) and stop strings
(host-side tables over the vocabulary and their in-graph matcher, `stop_strings`).

May import `tfgen.text` and the leaf utilities.
"""

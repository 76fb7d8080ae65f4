"""Structured output: a regex or JSON schema as a class-compressed token-level automaton (`automaton`, outlines-core's
`Index`) whose tables are run-time knobs, and JSON schemas as regexes (`json_schema`). The in-loop mask is
`tfgen.logits.grammar`.

May import `tfgen.text` and the leaf utilities.
"""

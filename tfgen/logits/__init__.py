"""Logits processing inside the compiled loop: the processors (HF's order and numerics, `processors`), the
sampling warpers (`warpers`), the structured-output mask (`grammar`), and how a `GenerationConfig` becomes the static
`ProcessorSpec` and its run-time knobs (`from_config`).

May import `tfgen.config`, `tfgen.structured` and the leaf utilities.
"""

"""Logits processing inside the compiled loop. Each processor and sampling warper is declared once
(`spec.Processor`): HF's processors (`processors`), the sampling warpers (`warpers`), the structured-output mask
(`grammar`); what they read (`context`: `ProcessorContext`, the knob readers); and the pipeline (`pipeline`): a
config read once into the static `ProcessorSpec` and its run-time knobs, and the processors run in order.

May import `tfgen.structured`, `tfgen.config` and the leaf utilities.
"""

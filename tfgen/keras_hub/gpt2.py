"""Placeholder (being written)."""

from tfgen.keras_hub.styles import DecoderStyle


class GPT2DecoderStyle(DecoderStyle):
    backbone_classes = ()

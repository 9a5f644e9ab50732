"""The key file's two forms, and its errors naming the file, the line and the field."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dynamoctl.frontend.auth import ApiKeys
from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.settings.frontend import ApiKeySettings
from dynamoctl.settings.keyfile import KeyFileError, parse_key_file

GOOD = """\
classes:
  interactive: {weight: 8}
  batch: {weight: 1}
keys:
  - name: alice
    key: sk-alice-0001
    class: interactive
    allowed_classes: [batch]
    limits: {requests_per_minute: 60, tokens_per_minute: 1000, concurrent_requests: 2,
             max_context: 4096}
  - name: nightly
    sha256: %s
    class: batch
"""


def test_yaml_form_gives_each_key_its_name_class_and_limits() -> None:
    digest = hashlib.sha256(b"sk-nightly-0002").hexdigest()
    keyfile = parse_key_file(GOOD % digest, "keys.yaml")
    alice, nightly = keyfile.keys
    assert (alice.name, alice.class_, alice.allowed_classes) == ("alice", "interactive", ["batch"])
    assert alice.limits.tokens_per_minute == 1000 and alice.limits.max_context == 4096
    assert nightly.limits.requests_per_minute is None
    assert keyfile.class_weights() == {"default": 1.0, "interactive": 8.0, "batch": 1.0}
    keys = ApiKeys(keyfile.keys)
    found = keys.identify([(b"authorization", b"Bearer sk-nightly-0002")])
    assert not isinstance(found, OpenAIError) and found.name == "nightly"
    assert isinstance(keys.identify([(b"authorization", b"Bearer sk-nightly-000")]), OpenAIError)


def test_line_form_is_unlimited_keys_named_by_line() -> None:
    keyfile = parse_key_file("# team\nsk-one\n\n  sk-two  \n", "keys.txt")
    assert [(k.name, k.key, k.class_) for k in keyfile.keys] == [
        ("key-2", "sk-one", "default"),
        ("key-4", "sk-two", "default"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("keys:\n  - name: a\n    key: k1\n    limits: {tokens_per_minute: 0}\n",
         "keys.yaml:4 keys.0.limits.tokens_per_minute: Input should be greater than or equal to 1"),
        ("keys:\n  - name: a\n    key: k1\n    limits: {rpm: 3}\n",
         "keys.yaml:4 keys.0.limits.rpm: Extra inputs are not permitted"),
        ("keys:\n  - name: a\n    key: k1\n  - name: a\n    key: k2\n",
         "keys.yaml:4 keys.1.name: 'a' is also keys[0]'s"),
        ("keys:\n  - name: a\n    key: k1\n  - name: b\n    key: k1\n",
         "keys.yaml:5 keys.1.key: the same key as keys[0]"),
        ("keys:\n  - name: a\n    key: k1\n    class: gold\n",
         "keys.yaml:4 keys.0.class: class 'gold' is not one of: default"),
        ("keys:\n  - name: a\n",
         "keys.yaml:2 keys.0: give exactly one of 'key' and 'sha256'"),
        ("classes: {batch: {weight: -1}}\nkeys:\n  - {name: a, key: k1}\n",
         "keys.yaml:1 classes.batch.weight: Input should be greater than 0"),
        ("keys: []\n",
         "keys.yaml:1 keys: List should have at least 1 item after validation, not 0"),
    ],
)  # fmt: skip
def test_errors_name_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(KeyFileError) as caught:
        parse_key_file(text, "keys.yaml")
    assert expected in str(caught.value).splitlines(), str(caught.value)


def test_settings_put_unlimited_keys_first_for_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        "keys:\n  - {name: capped, key: sk-capped, limits: {requests_per_minute: 1}}\n"
        "  - {name: ops, key: sk-ops}\n"
    )
    monkeypatch.setenv("MORE_KEYS", "sk-env-1, sk-env-2")
    settings = ApiKeySettings(api_keys_file=str(path), api_keys_env="MORE_KEYS")
    assert settings.load_api_keys() == ["sk-ops", "sk-env-1", "sk-env-2", "sk-capped"]
    names = [k.name for k in settings.load_key_file().keys]
    assert names == ["capped", "ops", "env-1", "env-2"]

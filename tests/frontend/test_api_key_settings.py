"""Where API keys come from: a file and an environment variable, and never silently
none when a source is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.settings.frontend import ApiKeySettings


def test_keys_are_read_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "k"
    keys.write_text("a1\n# comment\n\nb2 \n")
    monkeypatch.setenv("K", "c3,d4 e5\n")
    loaded = ApiKeySettings(api_keys_file=str(keys), api_keys_env="K").load_api_keys()
    assert sorted(loaded) == ["a1", "b2", "c3", "d4", "e5"]
    assert ApiKeySettings().load_api_keys() == []


@pytest.mark.parametrize("case", ["empty file", "missing file", "unset env", "empty env"])
def test_configured_but_no_keys_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Asking for keys and finding none refuses to start, rather than serve unprotected."""
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    monkeypatch.delenv("NO_SUCH_KEYS", raising=False)
    monkeypatch.setenv("EMPTY_KEYS", " ")
    settings = {
        "empty file": ApiKeySettings(api_keys_file=str(empty)),
        "missing file": ApiKeySettings(api_keys_file=str(tmp_path / "absent")),
        "unset env": ApiKeySettings(api_keys_env="NO_SUCH_KEYS"),
        "empty env": ApiKeySettings(api_keys_env="EMPTY_KEYS"),
    }[case]
    with pytest.raises(ValueError, match="API key"):
        settings.load_api_keys()


def test_env_field_takes_a_name_not_a_key() -> None:
    with pytest.raises(ValueError):
        ApiKeySettings(api_keys_env="sk-live-123")

"""``dynamoctl bench --help`` shows the length syntax as typed: rich markup reads ``:A:`` and
``:M:`` as emoji codes, and ``uniform:A:B`` came out as ``uniform🅰B``."""

from __future__ import annotations

from typer.testing import CliRunner

from dynamoctl.cli import app


def test_help_shows_length_syntax_literally() -> None:
    res = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for form in ("uniform:A:B", "normal:MEAN:STD", "exponential:MEAN"):
        assert form in res.output
    assert "\N{NEGATIVE SQUARED LATIN CAPITAL LETTER A}" not in res.output  # :a:
    assert "\N{CIRCLED LATIN CAPITAL LETTER M}" not in res.output  # :m:, the old normal:M:S

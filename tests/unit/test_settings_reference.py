"""docs/settings.md is what the settings models say: every key, its default and its meaning."""

from __future__ import annotations

from temporal_rollouts.settings_reference import DOC_PATH, render


def test_the_settings_reference_is_current() -> None:
    assert DOC_PATH.read_text(encoding="utf-8") == render(), (
        "docs/settings.md is out of date: python -m temporal_rollouts.settings_reference --write"
    )


def test_every_key_has_a_default_and_a_meaning() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) > 40
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] and cells[-1], f"no default or no meaning: {row}"
    keys = {row.split("`")[1] for row in rows}
    assert {"data_dir", "sandbox.reap_interval_s", "storage.payload_size_threshold", "base_url", "tokenizer"} <= keys

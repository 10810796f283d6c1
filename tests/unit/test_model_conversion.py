"""The converted copy of a GGUF (`smollm2.converted`) is made once however many processes ask, appears
whole or not at all, and is named by the GGUF's content. `_convert` is replaced by a stand-in that
writes a marker, so these run without transformers reading a model; the real conversion is checked
against the GGUF in tests/integration/test_model_conversion.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from temporal_rollouts.policy_servers import smollm2


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    made: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        made.append(out)
        time.sleep(0.2)  # long enough for the other callers to arrive while this one converts
        out.mkdir(parents=True)
        (out / "config.json").write_text(gguf.read_text())

    monkeypatch.setattr(smollm2, "_convert", convert)
    return made


def test_callers_at_once_convert_once_and_all_get_the_whole_folder(tmp_path: Path, conversions: list[Path]) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_text("weights")
    cache = tmp_path / "cache"
    got: list[Path] = []
    callers = [threading.Thread(target=lambda: got.append(smollm2.converted(gguf, cache))) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(conversions) == 1
    assert len(set(got)) == 1 and len(got) == 4
    assert (got[0] / "config.json").read_text() == "weights"
    assert sorted(p.name for p in cache.iterdir()) == sorted([got[0].name, got[0].name + ".lock"])


def test_another_content_gets_another_folder(tmp_path: Path, conversions: list[Path]) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_text("weights")
    first = smollm2.converted(gguf, tmp_path / "cache")
    gguf.write_text("other weights")
    second = smollm2.converted(gguf, tmp_path / "cache")
    assert first != second and len(conversions) == 2
    assert (second / "config.json").read_text() == "other weights"


def test_a_failed_conversion_leaves_nothing_and_the_next_call_converts(tmp_path: Path, monkeypatch) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_text("weights")
    cache = tmp_path / "cache"

    def half_then_fail(gguf: Path, out: Path) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(smollm2, "_convert", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        smollm2.converted(gguf, cache)
    assert [p.suffix for p in cache.iterdir()] == [".lock"]

    monkeypatch.setattr(smollm2, "_convert", lambda gguf, out: out.mkdir(parents=True))
    assert smollm2.converted(gguf, cache).is_dir()

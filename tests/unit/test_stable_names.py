"""Names that outlive a release: what users' files and existing histories already use."""

from __future__ import annotations

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage.converter import PAYLOAD_DRIVER_NAME


def test_settings_are_read_from_rollouts_toml_in_the_working_directory(tmp_path, monkeypatch) -> None:
    (tmp_path / "rollouts.toml").write_text('default_policy = "http://model:8000/v1"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROLLOUTS_CONFIG", raising=False)
    assert Settings().default_policy == "http://model:8000/v1"


def test_payload_references_keep_their_driver_name() -> None:
    """Every payload stored by reference names its driver (the re-layout once renamed it by
    accident): payloads of existing histories must stay readable."""
    assert PAYLOAD_DRIVER_NAME == "rollouts.payloads"

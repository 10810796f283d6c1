"""Weights read from disk replace a serving model's only when the whole checkpoint fits it
(temporal_rollouts/policy_servers/weights.py), on a tiny model with tied weights like SmolLM2's."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from temporal_rollouts.policy_servers.weights import WeightsError, load_into, read_state_dict, save_weights  # noqa: E402


class TiedModel(torch.nn.Module):
    def __init__(self, vocab: int = 10, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, vocab, bias=False)
        self.head.weight = self.embed.weight


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_saved_weights_load_back_and_stay_tied(tmp_path: Path) -> None:
    source, served = TiedModel(seed=1), TiedModel(seed=2)
    folder = save_weights(source, tmp_path / "step-1")
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"], "nothing half-written is left beside it"
    load_into(served, read_state_dict(folder))
    for name, tensor in source.state_dict().items():
        assert torch.equal(served.state_dict()[name], tensor), name
    assert served.head.weight is served.embed.weight

    again = TiedModel(seed=3)
    assert save_weights(again, tmp_path / "step-1") == folder, "an earlier run's checkpoint of that name is replaced"
    load_into(served, read_state_dict(folder))
    assert torch.equal(served.embed.weight, again.embed.weight)


def test_one_safetensors_file_is_a_checkpoint_too(tmp_path: Path) -> None:
    source, served = TiedModel(seed=1), TiedModel(seed=2)
    state = {name: tensor for name, tensor in source.state_dict().items() if name != "head.weight"}
    save_file(state, tmp_path / "weights.safetensors")
    load_into(served, read_state_dict(tmp_path / "weights.safetensors"))
    assert torch.equal(served.head.weight, source.embed.weight)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda state: state.update(extra=torch.zeros(1)), "does not"),
        (lambda state: state.pop("norm.weight"), "lacks"),
        (lambda state: state.update({"embed.weight": torch.zeros(11, 4)}), "another architecture"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_is_copied(change, words: str) -> None:
    served = TiedModel(seed=2)
    before = weights_of(served)
    state = {
        name: torch.full_like(tensor, 7.0) for name, tensor in TiedModel().state_dict().items() if name != "head.weight"
    }
    change(state)
    with pytest.raises(WeightsError, match=words):
        load_into(served, state)
    for name, tensor in served.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} changed although the update was refused"


def test_paths_without_safetensors_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    for path, words in [
        (tmp_path / "empty", "no .safetensors"),
        (tmp_path / "pytorch_model.bin", "neither"),
        (tmp_path / "missing", "neither"),
        (tmp_path / "broken.safetensors", "cannot read"),
    ]:
        with pytest.raises(WeightsError, match=words):
            read_state_dict(path)

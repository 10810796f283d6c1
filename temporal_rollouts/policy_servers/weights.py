"""New weights for a model that is already serving, read from disk the way SGLang's
`update_weights_from_disk` takes them: a folder saved with `save_pretrained` (its
`*.safetensors` files, sharded or not) or one `.safetensors` state dict, of the same
architecture as the model being served.

Everything is read and checked (names, shapes) before the first tensor is copied, so a
wrong or broken checkpoint is refused with the served weights untouched. Weights that
`save_pretrained` leaves out because they are tied to another (SmolLM2's `lm_head` is
its token embedding) follow the tensor they share storage with.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

SUFFIX = ".safetensors"


class WeightsError(ValueError):
    """A checkpoint that cannot replace the served weights; the message says why."""


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob(f"*{SUFFIX}"))
        if not files:
            raise WeightsError(f"{path} holds no {SUFFIX} files (save it with save_pretrained)")
    elif path.is_file() and path.suffix == SUFFIX:
        files = [path]
    else:
        raise WeightsError(f"{path} is neither a folder nor a {SUFFIX} file on this server")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except (OSError, SafetensorError) as err:
            raise WeightsError(f"cannot read {file}: {err}") from None
    return state


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `model`'s parameters and buffers, converted to their dtypes."""
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise WeightsError(f"the checkpoint has tensors this model does not: {unknown[:5]}")
    loaded_storage = {own[name].data_ptr() for name in state}
    missing = sorted(name for name in own if name not in state and own[name].data_ptr() not in loaded_storage)
    if missing:
        raise WeightsError(f"the checkpoint lacks tensors of this model: {missing[:5]}")
    wrong = [
        f"{name}: {tuple(tensor.shape)} for {tuple(own[name].shape)}"
        for name, tensor in state.items()
        if tensor.shape != own[name].shape
    ]
    if wrong:
        raise WeightsError(f"the checkpoint is another architecture: {wrong[:3]}")
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)


def save_weights(model: torch.nn.Module, folder: Path) -> Path:
    """Write `model`'s weights as `folder/model.safetensors`, which `read_state_dict` reads back.

    A checkpoint is the weights alone (the config stays the model's), written with safetensors'
    `save_model`, which stores tied tensors once. The file is
    written beside the folder and moved in place, so a server never sees half a checkpoint;
    a folder of the same name (an earlier run's) is replaced.
    """
    from safetensors.torch import save_model

    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_model(model, str(partial / f"model{SUFFIX}"))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder

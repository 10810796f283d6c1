"""SmolLM2 loaded from its converted copy (`smollm2.converted`, what every policy server and trainer
loads) is the GGUF's model: the same float32 tensors, the same config, and a tokenizer that encodes
and renders chats as the GGUF's own does."""

from __future__ import annotations

from pathlib import Path

import pytest

from temporal_rollouts.policy_servers import smollm2

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_the_converted_copy_holds_the_ggufs_weights_config_and_tokenizer(smollm2_gguf: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smollm2._build_name_map_once()
    direct = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32)
    copy = smollm2.load_model(smollm2_gguf)
    ours, theirs = copy.state_dict(), direct.state_dict()
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []
    assert copy.lm_head.weight.data_ptr() == copy.model.embed_tokens.weight.data_ptr()  # still tied
    differing = {
        key
        for key, value in copy.config.to_dict().items()
        if direct.config.to_dict().get(key) != value and key != "_name_or_path"
    }
    assert differing == set()
    assert getattr(copy, "hf_quantizer", None) is None  # plain float32: a trainer fine-tunes it as it is

    tokenizer = smollm2.load_tokenizer(smollm2_gguf)
    own = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi <|im_end|> twice"}]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True) == own.apply_chat_template(
        chat, add_generation_prompt=True
    )
    assert tokenizer.encode("naïve café, 12345 tokens\n\tend") == own.encode("naïve café, 12345 tokens\n\tend")

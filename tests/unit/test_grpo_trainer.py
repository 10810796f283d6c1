"""The GRPO example's step (examples/grpo/trainer.py) on hand-made groups and a tiny random
Llama: rewarded sequences gain probability, punished ones lose it, tokens whose ratio is past
the clip teach nothing, and padding does not change a sequence's logprobs."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from examples.grpo.trainer import (  # noqa: E402
    IGNORE_INDEX,
    ScoredSequence,
    group_advantages,
    sequences_of,
    token_logprobs,
    train_step,
)

PROMPT = [5, 9, 2, 7]
GOOD, BAD = [11, 12, 13], [21, 22, 23, 24, 25]


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config).eval()


def completion_logprob(model, completion: list[int]) -> float:
    sequence = ScoredSequence(PROMPT + completion, list(range(len(PROMPT), len(PROMPT) + len(completion))), [], 0.0)
    with torch.no_grad():
        return float(token_logprobs(model, [sequence])[0].sum())


def group(model, scores: list[float], completions: list[list[int]], shift: list[float] | None = None) -> dict:
    """One Atropos group: prompt masked, completion trainable, inference logprobs from `model`
    itself (moved by `shift[i]` per token, as if sampled by other weights)."""
    tokens, masks, logprobs = [], [], []
    for index, completion in enumerate(completions):
        sequence = PROMPT + completion
        with torch.no_grad():
            own = token_logprobs(model, [ScoredSequence(sequence, list(range(len(PROMPT), len(sequence))), [], 0.0)])[0]
        tokens.append(sequence)
        masks.append([IGNORE_INDEX] * len(PROMPT) + completion)
        logprobs.append([1.0] * len(PROMPT) + [v + (shift[index] if shift else 0.0) for v in own.tolist()])
    return {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": logprobs}


def test_advantages_are_normalised_within_the_group_and_equal_scores_teach_nothing() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    flat = {
        "tokens": [[1, 2]] * 2,
        "masks": [[IGNORE_INDEX, 2]] * 2,
        "scores": [0.5, 0.5],
        "inference_logprobs": [[1.0, -0.3]] * 2,
    }
    assert sequences_of([flat]) == []


def test_a_step_raises_the_rewarded_sequence_and_lowers_the_punished_one(model) -> None:
    before = completion_logprob(model, GOOD), completion_logprob(model, BAD)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    stats = train_step(model, optimizer, [group(model, [1.0, 0.0], [GOOD, BAD])])
    after = completion_logprob(model, GOOD), completion_logprob(model, BAD)
    assert after[0] > before[0] and after[1] < before[1], (before, after)
    assert (stats.sequences, stats.tokens, stats.mean_reward) == (2, len(GOOD) + len(BAD), 0.5)
    assert stats.logprob_gap_max < 1e-5, "the batch's logprobs are this model's own"
    assert stats.clipped == 0.0


def test_tokens_whose_ratio_is_past_the_clip_teach_nothing(model) -> None:
    untouched = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    # the rewarded sequence is already far likelier than when sampled, the punished one far less likely
    stale = group(model, [1.0, 0.0], [GOOD, BAD], shift=[-1.0, +1.0])
    stats = train_step(model, optimizer, [stale], clip=0.2)
    assert stats.clipped == 1.0 and stats.logprob_gap_max == pytest.approx(1.0, abs=1e-4)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, untouched[name]), f"{name} moved on clipped tokens"


def test_a_shared_prompt_and_padding_change_neither_logprobs_nor_gradients(model) -> None:
    """A micro-batch runs its sequences' common prompt once and pads them to one length; each
    must get what a plain full forward pass of it alone gives, gradients included."""
    short = ScoredSequence(PROMPT + GOOD, [4, 5, 6], [], 0.0)
    long = ScoredSequence(PROMPT + BAD, [4, 5, 6, 7, 8], [], 0.0)
    other_prompt = ScoredSequence([3] + PROMPT[1:] + GOOD, [4, 5, 6], [], 0.0)
    batches = [[short, long], [other_prompt, long]]

    def plain(sequence: ScoredSequence) -> torch.Tensor:
        ids = torch.tensor([sequence.tokens])
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        at = torch.tensor(sequence.trainable)
        return logprobs[at - 1].gather(-1, ids[0, at, None])[:, 0]

    def with_gradient(logprobs: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        sum(lp.sum() for lp in logprobs).backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        model.zero_grad()
        return [lp.detach() for lp in logprobs], grad

    together, together_grad = with_gradient([lp for batch in batches for lp in token_logprobs(model, batch)])
    apart, apart_grad = with_gradient([plain(sequence) for batch in batches for sequence in batch])
    for a, b in zip(together, apart):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(together_grad, apart_grad, atol=1e-5)

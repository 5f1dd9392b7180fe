"""Episodes across a weight update, on the real embedded engine: pause(abort) -> load -> continue.

Greedy decoding makes the claims exact: with the same weights an interrupted episode equals an
uninterrupted one token for token; with new weights its tokens switch to the new policy exactly
at the interruption, and `token_versions` says so.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.episode import run_episode
from rlvr.server.embedded import EmbeddedEngine

LONG = SamplingParams(temperature=0.0, max_new_tokens=900, ignore_eos=True)


def _perturbed_state(model_dir) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    return {
        k: v for k, v in model.state_dict().items() if k != "lm_head.weight" or not model.config.tie_word_embeddings
    }


async def _interrupted(engine: EmbeddedEngine, prompt: list[int], *, partial: bool, new_weights=None):
    """Run an episode; once it has some tokens, abort it, load weights as version 1, continue
    (the module's engine is put back at version 0 first)."""
    engine.load_state_dict([], version="0")
    gate = asyncio.Event()
    gate.set()
    task = asyncio.create_task(
        run_episode(engine, prompt_ids=prompt, params=LONG, partial=partial, weights_ready=gate.wait)
    )
    for _ in range(1000):
        if engine.scheduler.live and len(engine.scheduler.live[0].out) >= 20:
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError("the episode never started decoding")
    gate.clear()  # what the rollout manager does before a push
    assert engine.scheduler.pause("abort") == 1  # a direct call: it lands before the episode goes on
    if new_weights is None:
        engine.load_state_dict([], version="1")
    else:
        engine.load_state_dict(new_weights, version="1")
    await engine.resume()
    gate.set()
    return await asyncio.wait_for(task, 120)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = EmbeddedEngine(model_dir, max_batch=4, device="cpu")
    yield eng
    eng.close()


async def test_same_weights_interrupted_equals_uninterrupted(engine):
    prompt = engine.tokenizer.encode("the quick brown fox")
    (straight,) = await engine.generate([GenerateRequest(prompt, LONG)])
    episode = await _interrupted(engine, prompt, partial=True)
    assert episode.token_ids == straight.token_ids
    assert episode.finish_reason == "length" and len(episode.logprobs) == 900
    cut = episode.token_versions.index(1)
    assert 20 <= cut < 900 and set(episode.token_versions[:cut]) == {0} and set(episode.token_versions[cut:]) == {1}
    assert episode.oldest_version == 0 and episode.policy_version == 1
    torch.testing.assert_close(torch.tensor(episode.logprobs), torch.tensor(straight.logprobs), atol=1e-4, rtol=0)


async def test_new_weights_switch_exactly_at_the_interruption(engine, model_dir):
    prompt = engine.tokenizer.encode("solve: 2+2=")
    (old,) = await engine.generate([GenerateRequest(prompt, LONG)])
    new = _perturbed_state(model_dir)
    try:
        episode = await _interrupted(engine, prompt, partial=True, new_weights=new)
        cut = episode.token_versions.index(1)
        assert episode.token_ids[:cut] == old.token_ids[:cut]  # the old policy's tokens, kept
        # after the cut: what the new weights generate greedily from prompt + the kept prefix
        rest = SamplingParams(temperature=0.0, max_new_tokens=900 - cut, ignore_eos=True)
        (cont,) = await engine.generate([GenerateRequest(prompt + episode.token_ids[:cut], rest)])
        assert episode.token_ids[cut:] == cont.token_ids
        assert episode.token_ids != old.token_ids
    finally:
        await engine.update_weights_from_disk(model_dir, version="0")


async def test_without_partial_an_aborted_episode_restarts_from_its_prompt(engine, model_dir):
    prompt = engine.tokenizer.encode("hello")
    new = _perturbed_state(model_dir)
    try:
        episode = await _interrupted(engine, prompt, partial=False, new_weights=new)
        assert set(episode.token_versions) == {1} and len(episode.token_ids) == 900
        (fresh,) = await engine.generate([GenerateRequest(prompt, LONG)])
        assert episode.token_ids == fresh.token_ids  # entirely the new policy's answer
    finally:
        await engine.update_weights_from_disk(model_dir, version="0")


# -- text and stop strings across aborts (partial rollout), on a token-exact fake engine ------------


def _byte_tokenizer():
    """Byte-level BPE without merges: one token per UTF-8 byte, so "é" is two tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={"<eos>": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # pyright: ignore[reportAttributeAccessIssue]
    core.decoder = decoders.ByteLevel()  # pyright: ignore[reportAttributeAccessIssue]
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def _sentencepiece_tokenizer():
    """Whole words marked with SentencePiece's "▁" (Metaspace): the first word of a decoded
    stretch loses its space, as with Llama/Mistral/Gemma tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]
    vocab = {"<eos>": 0, "<unk>": 1, **{"▁" + w: i + 2 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")  # pyright: ignore[reportAttributeAccessIssue]
    core.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")  # pyright: ignore[reportAttributeAccessIssue]
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")


def _char_tokenizer():
    from rlvr.tiny import build_char_tokenizer

    return build_char_tokenizer()


class StreamEngine:
    """Plays one fixed token stream as "the model": a request continues the stream where its input
    (prompt + ids so far) leaves off. Request i returns at most `chunks[i]` tokens, then aborts (a
    weight push); once `chunks` is used up a request runs on. Each request is version i. Stops as
    the embedded engine stops: an EOS ends it (kept), and so does a stop string in the text of
    *this request's own* output (the ids that spelled it kept, the text cut before it). The
    tokenizer is `tok`, not `tokenizer`, so the episode decodes only with what it is given."""

    def __init__(self, tok, prompt: list[int], stream: list[int], chunks: list[int]):
        self.tok, self.prompt, self.stream, self.chunks = tok, prompt, stream, list(chunks)
        self.inputs: list[list[int]] = []

    async def generate(self, requests):
        from rlvr.types import Completion

        (request,) = requests
        self.inputs.append(list(request.input_ids))
        pos = len(request.input_ids) - len(self.prompt)
        assert request.input_ids == self.prompt + self.stream[:pos], "the episode must resend its own ids"
        limit = self.chunks.pop(0) if self.chunks else None
        out: list[int] = []
        finish, matched = "length", None
        for token in self.stream[pos:]:
            if limit is not None and len(out) == limit:
                finish = "abort"
                break
            if len(out) >= request.params.max_new_tokens:
                break
            out.append(token)
            if token == self.tok.eos_token_id:
                finish = "stop"
                break
            text = self.tok.decode(out, skip_special_tokens=True)
            matched = next((s for s in request.params.stop if s in text), None)
            if matched is not None:
                finish = "stop"
                break
        text = self.tok.decode(out, skip_special_tokens=True)
        if matched is not None:
            text = text[: text.find(matched)]
        return [
            Completion(
                text=text,
                token_ids=out,
                logprobs=[-0.01 * (pos + i + 1) for i in range(len(out))],  # one per stream position
                finish_reason=finish,
                prompt_token_ids=list(request.input_ids),
                policy_version=len(self.inputs) - 1,
            )
        ]


async def _stream_episode(tok, text: str, chunks: list[int], *, stop=(), eos=True, max_new_tokens=200):
    prompt = tok("q", add_special_tokens=False)["input_ids"]
    stream = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    engine = StreamEngine(tok, prompt, stream, chunks)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=list(stop))
    completion = await run_episode(engine, prompt_ids=prompt, params=params, partial=True, tokenizer=tok)  # pyright: ignore[reportArgumentType]
    return engine, completion


async def test_a_character_split_by_an_abort_is_decoded_whole():
    """'é' is two byte tokens; the abort falls between them. Joining each request's text (the old
    way) gives 'caf\ufffd\ufffd au lait'; decoding all ids gives what an uninterrupted run gives."""
    tok = _byte_tokenizer()
    assert len(tok("é", add_special_tokens=False)["input_ids"]) == 2
    _, straight = await _stream_episode(tok, "café au lait", [])
    engine, episode = await _stream_episode(tok, "café au lait", [4])  # c a f 0xC3 | 0xA9 ...
    assert len(engine.inputs) == 2 and set(episode.token_versions) == {0, 1}
    assert "\ufffd" not in episode.text and episode.text == straight.text == "café au lait"
    assert episode.token_ids == straight.token_ids and episode.finish_reason == "stop"


async def test_a_sentencepiece_word_after_an_abort_keeps_its_space():
    """A Metaspace tokenizer decodes '▁brown' alone as 'brown': joined texts read 'the quickbrown fox'."""
    tok = _sentencepiece_tokenizer()
    engine, episode = await _stream_episode(tok, "the quick brown fox", [2])
    assert len(engine.inputs) == 2
    assert episode.text == "the quick brown fox"


@pytest.mark.parametrize("chunks", [[13], [11], [15], [11, 3], [12, 1, 1]], ids=str)
async def test_a_stop_string_straddling_aborts_stops_the_response(chunks):
    """'</answer>' spans tokens 10..18 of the stream; the aborts fall inside it, so no request sees
    it whole and each engine runs on. The episode still stops right after the token that completed
    it, and every per-token array matches an uninterrupted run (which the engine stopped itself)."""
    tok, text = _char_tokenizer(), "<answer>42</answer> and then rambling on"
    _, straight = await _stream_episode(tok, text, [], stop=["</answer>"])
    assert straight.finish_reason == "stop" and straight.text == "<answer>42"
    assert tok.decode(straight.token_ids) == "<answer>42</answer>"  # the stop's ids kept, as engines do
    engine, episode = await _stream_episode(tok, text, chunks, stop=["</answer>"])
    assert len(engine.inputs) == len(chunks) + 1
    assert episode.finish_reason == "stop" and episode.text == straight.text
    assert episode.token_ids == straight.token_ids
    assert episode.logprobs == straight.logprobs
    assert len(episode.token_versions) == len(episode.token_ids) and episode.token_versions[-1] == len(chunks)


async def test_a_stop_string_completed_by_a_continuation_ends_the_episode_there():
    """The continuation completes the stop on its first token, although its own text never holds
    the stop: the episode does not go on to sample the budget's worth past it."""
    tok = _char_tokenizer()
    engine, episode = await _stream_episode(
        tok, "Final: 7\nUser: and now?", [9], stop=["\nUser:"], eos=False, max_new_tokens=100
    )
    assert episode.finish_reason == "stop" and episode.text == "Final: 7"
    assert tok.decode(episode.token_ids) == "Final: 7\nUser:" and len(episode.logprobs) == 14
    assert len(engine.inputs) == 2  # nothing is sent after the stop


async def test_text_across_aborts_without_a_stop_string_is_the_whole_decode():
    tok = _byte_tokenizer()
    engine, episode = await _stream_episode(tok, "naïve – déjà vu", [3, 2, 5], stop=["</answer>"])
    assert len(engine.inputs) == 4 and episode.finish_reason == "stop"  # on EOS, after three aborts
    assert episode.text == "naïve – déjà vu" and episode.token_ids[-1] == tok.eos_token_id

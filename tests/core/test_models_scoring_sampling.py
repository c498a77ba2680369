"""core/: model I/O, teacher-forced scoring and the sampler registry, against second methods."""
import sys

import pytest
import torch

from core.models import load_checkpoint, load_policy, model_path, resolve_dtype
from core.sampling import SAMPLERS, HFSampler, SamplingSettings, resolve_sampler
from core.scoring import Sequences, compute_logprobs, mean_token_entropies, token_entropies
from tests.conftest import REPO
from training.collect import RolloutRequest, collect_rollouts

ROWS = [{"id": "a", "prompt": "Compute 3 + 4.", "gold": "7", "task": "arithmetic"},
        {"id": "b", "prompt": "Compute 12 + 30. Answer with just the number.", "gold": "42", "task": "arithmetic"}]


@pytest.mark.parametrize("chunk", [1, 3, 512])
def test_chunked_entropy_equals_the_full_logits_entropy(tiny_policy, chunk):
    """Second method: compute_logprobs materialises the whole (B, L, V) logits; token_entropies runs the decoder
    once and the output head in chunks of positions. Same numbers, at T = 1 and T = 0.7."""
    model, tok = tiny_policy
    batch, _ = collect_rollouts(model, tok, ROWS, RolloutRequest(3, 1.0, 1.0, 7, seed=3))
    for temperature in (1.0, 0.7):
        _, full = compute_logprobs(model, Sequences.of(batch),
                                   temperature, with_entropy=True)
        chunked = token_entropies(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
                                  temperature, chunk_tokens=chunk)
        m = batch.response_mask.bool()
        assert torch.allclose(chunked[m], full[m], atol=1e-5)


def test_mean_entropies_from_token_lists_equal_a_per_sequence_forward(tiny_policy):
    """Lists of token ids (what vLLM returns), padded and length-sorted inside, against one unpadded forward each."""
    model, tok = tiny_policy
    prompts = [tok("Compute 3 + 4.", add_special_tokens=False).input_ids, tok("Hi", add_special_tokens=False).input_ids,
               tok("A much longer prompt with many more tokens than the others", add_special_tokens=False).input_ids]
    responses = [[100, 200, 300], [5, 6, 7, 8, 9, 10], [42]]
    got = mean_token_entropies(model, prompts, responses, temperature=0.9, pad_id=tok.pad_token_id, rows=2, chunk_tokens=2)
    for p, r, g in zip(prompts, responses, got):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1].float() / 0.9
        lp = torch.log_softmax(logits, -1)
        assert g == pytest.approx(float(-(lp.exp() * lp).sum(-1).mean()), rel=1e-5)


def test_hf_sampler_seeds_a_batch_and_reports_the_seed(tiny_policy):
    sampler = HFSampler(*tiny_policy, with_entropy=False)
    settings = SamplingSettings(1.0, 1.0, 6, True)
    a = sampler.sample(["Compute 1 + 1.", "Compute 2 + 2."], 2, [11, 12], settings)
    b = sampler.sample(["Compute 1 + 1.", "Compute 2 + 2."], 2, [11, 99], settings)
    assert [s["response"] for g in a for s in g] == [s["response"] for g in b for s in g]  # one stream per batch
    assert {s["seed"] for g in a for s in g} == {11} and a[0][0]["mean_token_entropy"] is None
    assert sampler.entropy_method is None


def test_auto_picks_vllm_only_with_cuda_and_explicit_choices_are_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_sampler("auto") == "hf"
    with pytest.raises(ValueError, match="eval.sampler='nosuch'"):
        resolve_sampler("nosuch")
    if SAMPLERS["vllm"].missing() is None:  # vLLM installed: auto takes it once a GPU is visible
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert resolve_sampler("auto") == "vllm"
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    assert resolve_sampler("auto") == "hf"
    with pytest.raises(ValueError, match="eval.sampler='vllm': vLLM is not installed"):
        resolve_sampler("vllm")


def test_model_path_of_the_tiny_model_holds_the_same_weights(tiny_cfg, tiny_policy):
    path = model_path(tiny_cfg.model)
    assert model_path(tiny_cfg.model) == path  # built once, then found in the cache
    loaded, tok = load_checkpoint(path)
    for (name, a), b in zip(loaded.named_parameters(), tiny_policy[0].parameters()):
        assert torch.equal(a, b), name
    assert tok.padding_side == "left" and tok.pad_token is not None
    again, _ = load_policy(tiny_cfg.model)
    assert torch.equal(next(again.parameters()), next(loaded.parameters()))


def test_dtype_choice():
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ValueError, match="dtype='fp8'"):
        resolve_dtype("fp8", "cpu")


def _trunk_tokens(model):
    """A forward hook on the decoder trunk counting the input tokens it processes (rows x columns)."""
    seen = []
    handle = model.base_model.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    return seen, handle


def test_shared_prompt_pass_equals_whole_rows_in_values_and_gradients(tiny_policy):
    """Each distinct prompt runs through the decoder once, its cache shared by its G responses. Second methods:
    the same call with share_prompts=False (log-probs, entropies, every parameter's gradient), and one unpadded
    forward per sequence for the log-probs. The hook shows the shared call really ran fewer tokens."""
    model, tok = tiny_policy
    batch, _ = collect_rollouts(model, tok, ROWS, RolloutRequest(4, 1.0, 1.0, 7, seed=5))
    idx = torch.tensor([5, 0, 6, 1, 2, 7])  # a shuffled minibatch: both prompts, repeated, rows out of order
    mb = batch.select(idx)
    args = (mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask, 0.8)
    m = mb.response_mask.bool()
    results = {}
    model.train()
    try:
        for share in (False, True):
            seen, handle = _trunk_tokens(model)
            model.zero_grad(set_to_none=True)
            lp, ent = compute_logprobs(model, Sequences(*args[:4]), args[4], with_entropy=True, share_prompts=share)
            handle.remove()
            (lp * mb.response_mask).sum().backward()
            results[share] = (lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()], sum(seen))
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    (lp0, ent0, g0, n0), (lp1, ent1, g1, n1) = results[False], results[True]
    P, L = mb.prompt_ids.shape[1], mb.response_ids.shape[1]
    assert n0 == 6 * (P + L) and n1 == 2 * P + 6 * L  # two distinct prompts, once each
    assert torch.allclose(lp1[m], lp0[m], atol=1e-5) and torch.allclose(ent1[m], ent0[m], atol=1e-5)
    for a, b in zip(g1, g0):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    for i in range(6):  # independent: each sequence alone, no padding, no cache
        p = mb.prompt_ids[i][mb.prompt_mask[i].bool()]
        r = mb.response_ids[i][mb.response_mask[i].bool()]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([p, r])[None]).logits[0, len(p) - 1:-1].float() / 0.8
        want = torch.log_softmax(logits, -1).gather(-1, r[:, None])[:, 0]
        assert torch.allclose(lp1[i, :len(r)], want, atol=1e-5)


def test_generation_prefills_each_prompt_once_and_draws_the_same_samples(tiny_policy, monkeypatch):
    """generate_responses prefills each prompt once and repeats its cache for the n samples; the draws equal
    generate's own num_return_sequences path (the shared prefill switched off), token for token."""
    import core.sampling as cs

    model, tok = tiny_policy
    texts = cs.prompt_texts(tok, [r["prompt"] for r in ROWS])
    seen, handle = _trunk_tokens(model)
    shared = cs.generate_responses(model, tok, texts, 4, cs.SamplingSettings(1.0, 0.9, 9), seed=7)
    handle.remove()
    P = shared.prompt_ids.shape[1]
    assert seen[0] == 2 * (P - 1)  # the prefill: two prompts, not eight rows
    monkeypatch.setattr(cs.generate, "_shared_prefill", lambda *a: None)  # core/sampling/generate.py
    plain = cs.generate_responses(model, tok, texts, 4, cs.SamplingSettings(1.0, 0.9, 9), seed=7)
    assert torch.equal(shared.response_ids, plain.response_ids) and shared.texts == plain.texts


# the architectures behind sweeps/model/ (transformers' model_type of each family)
FAMILIES = {"qwen2.5-7b": "qwen2", "qwen2.5-7b-instruct": "qwen2", "qwen2.5-3b-instruct": "qwen2", "qwen2.5-3b": "qwen2",
            "qwen2.5-coder-1.5b": "qwen2", "qwen2.5-7b-instruct-1m": "qwen2", "qwen2.5-math-1.5b": "qwen2",
            "qwen2.5-math-7b": "qwen2", "qwen3-0.6b": "qwen3", "qwen3-4b-instruct-2507": "qwen3",
            "phi-3.5-mini-instruct": "phi3", "mistral-7b-instruct-v0.3": "mistral", "llama-3.1-8b-instruct": "llama"}
BASE_MODELS = {"qwen2.5-7b", "qwen2.5-3b", "qwen2.5-coder-1.5b", "qwen2.5-math-1.5b", "qwen2.5-math-7b"}  # plain prompts


@pytest.mark.slow
def test_every_model_preset_composes_with_its_hub_path_and_chat_setting():
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.checks.validate import validate_config

    names = {p.stem for p in (REPO / "sweeps" / "model").glob("*.yaml")} - {"smollm2-135m", "tiny-random"}
    assert names == set(FAMILIES)
    for name in sorted(names):
        [(_, cfg)] = sweep_points([f"model={name}"])
        validate_config(cfg)
        assert cfg.model.source == "pretrained" and "/" in cfg.model.path, name
        assert cfg.model.chat_template == (name not in BASE_MODELS), name


@pytest.mark.parametrize("family", sorted(set(FAMILIES.values())))
def test_each_model_family_runs_the_shared_prompt_scoring_path(family):
    """A tiny randomly initialised model of each family's architecture (transformers' own config class: Qwen2's
    biases, Qwen3's q/k norms, Phi-3's fused projections, Mistral's sliding window) through the log-prob pass
    the trainer uses: the shared-prompt cache path equals one unpadded forward per sequence."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.scoring import _separable

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(family, vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               pad_token_id=0, tie_word_embeddings=False)
    if family == "qwen3":
        cfg.head_dim = 16
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    assert _separable(model), family  # the trunk and head split that the shared prompt pass takes
    prompt_ids = torch.tensor([[0, 5, 6, 7], [0, 5, 6, 7], [8, 9, 10, 11], [8, 9, 10, 11]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    response_ids = torch.tensor([[12, 13, 14], [15, 16, 0], [17, 18, 19], [20, 0, 0]])
    response_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    with torch.no_grad():
        lp, _ = compute_logprobs(model, Sequences(prompt_ids, prompt_mask, response_ids, response_mask), 1.0, share_prompts=True)
        for i in range(4):
            p = prompt_ids[i][prompt_mask[i].bool()]
            r = response_ids[i][response_mask[i].bool()]
            logits = model(input_ids=torch.cat([p, r])[None]).logits[0, len(p) - 1:-1].float()
            want = torch.log_softmax(logits, -1).gather(-1, r[:, None])[:, 0]
            assert torch.allclose(lp[i, :len(r)], want, atol=1e-5), (family, i)


@pytest.mark.slow
def test_transformers_sampling_draws_from_its_own_generator_not_torch_global_one(tiny_policy, monkeypatch):
    """generate_responses draws from a generator of its own, seeded with the call's seed: its samples equal
    transformers' own sampling after ``torch.manual_seed(seed)`` (the second method: generate's multinomial on the
    global generator, the shared prefill off), and they stay the same while another thread reseeds and draws from
    torch's global generator and runs a gradient-checkpointed backward (its recompute sets the global state back and
    forth: the update beside an overlapped rollout, train.rollout.overlap; a CI run drew other samples that way)."""
    import threading

    import core.sampling as cs

    model, tok = tiny_policy
    texts = cs.prompt_texts(tok, [r["prompt"] for r in ROWS])
    settings = cs.SamplingSettings(1.0, 0.9, 12)
    monkeypatch.setattr(cs.generate, "_shared_prefill", lambda *a: None)
    alone = cs.generate_responses(model, tok, texts, 4, settings, seed=7)
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(7)
    own = model.generate(**enc, do_sample=True, temperature=1.0, top_p=0.9, top_k=0, max_new_tokens=12,
                         num_return_sequences=4, pad_token_id=tok.pad_token_id)[:, enc["input_ids"].shape[1]:]
    assert torch.equal(alone.response_ids, own[:, : alone.response_ids.shape[1]])

    import copy

    from torch.utils.checkpoint import checkpoint

    other = copy.deepcopy(model).train()
    x = torch.randint(0, 100, (2, 16))
    box = {}
    thread = threading.Thread(target=lambda: box.update(g=cs.generate_responses(model, tok, texts, 4, settings, seed=7)))
    thread.start()
    i = 0
    while thread.is_alive():
        torch.manual_seed(i)
        torch.rand(1000)
        out = checkpoint(lambda ids: other(input_ids=ids).logits.float().mean(), x, use_reentrant=False)
        out.backward()
        i += 1
    thread.join()
    assert i > 0 and torch.equal(box["g"].response_ids, alone.response_ids) and box["g"].texts == alone.texts

"""Tool-augmented rollouts: the retrieval server (BM25 over the generated world; 32 queries in flight; a killed
server), the multi-turn loop on a real (tiny) model, the masking of tool tokens in every loss term for GRPO, TR-GRPO
and QUATRO, and the search QA tasks (Search-R1's exact match, TR-GRPO's +1/-1 reward, FlashRAG files)."""
import json
import threading
import time

import pytest
import torch
from omegaconf import OmegaConf

from core.retrieval import RetrievalServer, build_index, retrieve
from core.tasks import get_task, score_responses
from core.tasks.search_qa import exact_match, make_world, normalize_answer
from core.tools import SearchTool, Tool, ToolUnavailable


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The generated world's corpus and questions, indexed with BM25, served on a free port of 127.0.0.1."""
    d = tmp_path_factory.mktemp("world")
    passages, questions = make_world(40, seed=0)
    (d / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    index = build_index(d / "corpus.jsonl", d / "index")
    server = RetrievalServer(index)
    yield passages, questions, server, d
    server.close()


def test_the_server_answers_32_queries_in_flight_and_finds_each_fact(world):
    """32 threads ask at once, each for one person's home town: every answer's top passage is that person's
    "born in" passage (BM25 on the name and the relation); the index build is cached (same corpus bytes)."""
    passages, questions, server, d = world
    people = [q["question"][len("Where was "):-len(" born?")] for q in questions if q["question"].startswith("Where was")]
    assert len(people) == 40
    results, errors = {}, []
    barrier = threading.Barrier(32)

    def ask(name):
        try:
            barrier.wait(10)
            results[name] = retrieve(server.url, [f"{name} born in"], topk=3, timeout_s=30)[0]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(p,)) for p in people[:32]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 32
    for name, hits in results.items():
        assert hits[0]["contents"] == next(p["contents"] for p in passages if p["contents"].startswith(f'"{name}"\n{name} born in'))
    mtime = (d / "index" / "meta.json").stat().st_mtime
    build_index(d / "corpus.jsonl", d / "index")  # cached: nothing rebuilt
    assert (d / "index" / "meta.json").stat().st_mtime == mtime


def test_a_killed_server_stops_the_tool_with_one_line_and_a_failed_call_answers_the_policy(world, tmp_path):
    passages, _, _, d = world
    server = RetrievalServer(d / "index")
    tool = SearchTool(server.url, topk=2, timeout_s=5)
    [text] = tool.call([passages[0]["contents"].split("\n")[0].strip('"')])
    assert text.startswith("Doc 1(Title: ") and "Doc 2(" in text
    server.proc.kill()
    server.proc.wait(10)
    t0 = time.time()
    with pytest.raises(ToolUnavailable) as e:
        tool.call(["anything"])
    assert time.time() - t0 < 5 and "\n" not in str(e.value) and server.url in str(e.value)
    # a server that answers badly (here: not a retrieval server) is one failed call: an error text for the policy
    import http.server

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        [text] = SearchTool(f"http://127.0.0.1:{httpd.server_address[1]}", timeout_s=5).call(["q"])
        assert text.startswith("search failed: HTTPError")
    finally:
        httpd.shutdown()


class _Echo(Tool):
    """A test tool whose closing tag is a piece of text the tiny model writes greedily (so the loop really stops
    there); it answers every call with a fixed text and counts calls."""

    def __init__(self, close: str):
        self.name, self._close, self.calls = "echo", close, []

    @property
    def open_tag(self):
        return "<echo>"

    @property
    def close_tag(self):
        return self._close

    def call(self, queries):
        self.calls.append(list(queries))
        return ["RESULT"] * len(queries)


def test_the_multi_turn_loop_on_a_real_model_masks_exactly_the_tool_tokens(tiny_policy):
    """The tiny model samples an episode without tools; a test tool whose closing text is a piece of that episode
    (tokens 3-4) makes the same draw stop there, take the tool's result (mask 0), and go on (mask 1)."""
    from core.agent import ToolUse, generate_with_tools
    from core.sampling import SamplingSettings, prompt_texts

    model, tok = tiny_policy
    texts = prompt_texts(tok, ["Compute 2 + 2.", "Name a colour."], True)
    plain = generate_with_tools(model, tok, texts, 1, SamplingSettings(1.0, 1.0, 12), 7, ToolUse({}))
    ids = plain.response_ids[0][plain.response_mask[0].bool()].tolist()
    assert len(ids) >= 6 and int(plain.tool_calls.sum()) == 0 and torch.equal(plain.response_lengths, plain.response_mask.sum(-1))
    close = tok.decode(ids[2:4])
    cut = next(j + 1 for j in range(len(ids)) if close in tok.decode(ids[: j + 1]))
    assert close.strip() and close not in texts[0][-len(close):] + tok.decode(ids[:1])
    echo = _Echo(close)
    gen = generate_with_tools(model, tok, texts, 1, SamplingSettings(1.0, 1.0, 40), 7,
                              ToolUse({"echo": echo}, max_turns=1, max_obs_tokens=8))
    obs = tok("\n\n<information>", add_special_tokens=False).input_ids + tok("RESULT", add_special_tokens=False).input_ids \
        + tok("</information>\n\n", add_special_tokens=False).input_ids
    resp, mask = gen.response_ids[0].tolist(), gen.response_mask[0].tolist()
    assert resp[:cut] == ids[:cut] and mask[:cut] == [1] * cut  # the policy's first turn: the same draw, to the tag
    assert resp[cut:cut + len(obs)] == obs and mask[cut:cut + len(obs)] == [0] * len(obs)  # the tool's tokens
    assert gen.tool_calls[0] == 1 and gen.tool_tokens[0] == len(obs)
    assert int(gen.response_lengths[0]) == sum(mask) and "<information>RESULT</information>" in gen.texts[0]
    assert sum(mask[cut + len(obs):]) > 0  # the policy went on after reading the result
    assert echo.calls[0][0] == tok.decode(ids[:cut]).split(close)[0].strip()  # the turn's text as the query


@pytest.mark.parametrize("algo", ["grpo", "tr_grpo", "quatro"])
def test_tool_tokens_get_no_gradient_in_any_loss_term(algo, tiny_policy, tiny_cfg):
    """Log-probs from the tiny model through the trainer's own scoring and loss (policy loss, k3 KL to a reference,
    entropy bonus): d loss / d log-prob is exactly 0 at every tool token and not 0 at the policy's; any values at
    the tool positions (other log-probs, other references) leave the loss and its gradient unchanged, so the loss
    depends on the tool's tokens only through the context they give the policy's tokens."""
    from core.scoring import Sequences, compute_logprobs
    from orchestrator.checks.preflight import sweep_points
    from training.algorithms import BoundLoss, get_advantage_fn
    from training.batch import RolloutBatch
    from training.settings import RunSettings
    from training.update import policy_objective

    model, tok = tiny_policy
    [(_, cfg)] = sweep_points([f"algo={algo}", "model=tiny-random", "eval=smoke"])
    torch.manual_seed(0)
    B, P, L = 8, 4, 10
    prompt_ids = torch.randint(5, 200, (B, P))
    response_ids = torch.randint(5, 200, (B, L))
    mask = torch.ones(B, L, dtype=torch.long)
    mask[:, 3:7] = 0            # tokens 3-6: a tool's result
    mask[::2, 9:] = 0           # some responses end earlier
    with torch.no_grad():
        old, _ = compute_logprobs(model, Sequences(prompt_ids, torch.ones(B, P, dtype=torch.long), response_ids, mask))
    ref = old - 0.05 * torch.rand(B, L)
    batch = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=torch.ones(B, P, dtype=torch.long), response_ids=response_ids,
                         response_mask=mask, old_logprobs=old - 0.02, rewards=torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0]),
                         group_index=torch.tensor([0] * 4 + [1] * 4), response_lengths=mask.sum(-1), ref_logprobs=ref,
                         correct=torch.tensor([1, 0, 0, 1, 1, 0, 1, 0], dtype=torch.bool))
    algo = RunSettings.of(cfg).algo
    adv, _ = get_advantage_fn(algo.advantage)(batch, **algo.advantage_params)
    bound = BoundLoss.named(algo.policy_loss, algo.policy_loss_params)

    def loss_and_grad(lp_values, entropy_values, b):
        lp = lp_values.clone().requires_grad_(True)
        ent = entropy_values.clone().requires_grad_(True)
        loss, _, _ = policy_objective(lp, ent, b, adv, bound, beta=0.01, entropy_coef=0.01)
        loss.backward()
        return float(loss), lp.grad, ent.grad

    lp, ent = compute_logprobs(model, Sequences(prompt_ids, torch.ones(B, P, dtype=torch.long), response_ids, mask), with_entropy=True)
    lp, ent = lp.detach(), ent.detach()
    loss, g_lp, g_ent = loss_and_grad(lp, ent, batch)
    tool = torch.zeros(B, L, dtype=torch.bool)
    tool[:, 3:7] = True
    assert torch.all(g_lp[tool] == 0) and torch.all(g_ent[tool] == 0)
    assert (g_lp[mask.bool()] != 0).any() and (g_ent[mask.bool()] != 0).any()
    noise = torch.where(tool, torch.randn(B, L), torch.zeros(B, L))
    other = RolloutBatch(**{**batch.__dict__, "old_logprobs": batch.old_logprobs + noise, "ref_logprobs": ref + noise})
    loss2, g_lp2, g_ent2 = loss_and_grad(lp + 3 * noise, ent + noise, other)
    assert loss2 == pytest.approx(loss, rel=1e-6, abs=1e-9)
    assert torch.allclose(g_lp2, g_lp, atol=1e-9) and torch.allclose(g_ent2, g_ent, atol=1e-9)


@pytest.mark.parametrize("answer,golds,em", [
    ("The Eiffel Tower!", ["eiffel tower"], True), ("an apple", ["Apple"], True), ("Paris, France", ["Paris"], False),
    ("  New   York ", ["new york city", "New York"], True), ("", ["x"], False), (None, ["x"], False),
])
def test_exact_match_by_hand(answer, golds, em):
    """Search-R1's normalisation (lower case, no punctuation, no a / an / the, single spaces), by hand."""
    assert exact_match(answer, golds) is em
    assert normalize_answer("The  Cat's  hat.") == "cats hat"


def test_search_qa_rewards_and_flashrag_files(tmp_path):
    """+1 for an exact match of the last <answer>, -1 otherwise (an unanswered episode too); FlashRAG's records
    (question, golden_answers) from a local folder, as each of the seven benchmarks reads them."""
    (tmp_path / "hotpotqa").mkdir()
    (tmp_path / "hotpotqa" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"id": "h1", "question": "Which city hosts the Louvre?", "golden_answers": ["Paris", "Paris, France"]},
        {"id": "h2", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare"]}]) + "\n")
    rows = get_task("hotpotqa").load("test", OmegaConf.create({"data_dir": str(tmp_path)}))
    assert [r["id"] for r in rows] == ["h1", "h2"] and "Question: Which city hosts the Louvre?" in rows[0]["prompt"]
    assert get_task("hotpotqa").kind == "search_multihop" and get_task("nq").kind == "search_general"
    responses = ["<think>x</think><search>louvre</search><information>...</information><answer> paris, france </answer>",
                 "<answer>Marlowe</answer> then <answer>william shakespeare</answer>", "I think it is Paris."]
    scores = score_responses(responses, [rows[0], rows[1], rows[0]])
    assert [(s.reward, s.correct) for s in scores] == [(1.0, True), (1.0, True), (-1.0, False)]
    assert scores[2].extracted is None
    with pytest.raises(ValueError, match="no hotpotqa/test.jsonl"):
        get_task("hotpotqa").validate(OmegaConf.create({"data_dir": str(tmp_path / "none")}), "eval")


def test_the_generated_world_needs_retrieval_and_its_rows_name_their_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    passages, questions = make_world(10, seed=3)
    assert len(passages) == 50 and len(questions) == 40 and make_world(10, seed=3) == (passages, questions)
    cfg = OmegaConf.create({"name": "search_demo", "n_entities": 10, "seed": 3, "n_eval": 8, "max_prompts": None,
                            "response_prefix": "<search>"})
    train, held = get_task("search_demo").load("train", cfg), get_task("search_demo").load("eval", cfg)
    assert len(train) == 32 and len(held) == 8 and not {r["id"] for r in train} & {r["id"] for r in held}
    corpus = {json.loads(x)["contents"] for x in open(train[0]["corpus"]) if x.strip()}
    for r in train + held:  # every gold answer is written in a passage about the person the question names
        gold = json.loads(r["gold"])[0]
        about = [c for c in corpus if c.split("\n")[0].strip('"') in r["problem"]]
        assert len(about) == 5 and sum(c.endswith(f" {gold}.") for c in about) == 1, r
        assert r["response_prefix"] == "<search>"


def test_the_validation_inside_the_loop_samples_tool_episodes_through_the_training_rollout(tiny_policy):
    """Issue 69: the validation inside the training loop samples through the training's rollout
    (:class:`core.sampling.RolloutSampler`); a task whose rows call tools gets the same multi-turn episodes as the
    loop itself draws (:func:`core.agent.generate_with_tools` with the same seed), tool calls counted per sample."""
    from core.agent import ToolUse, generate_with_tools
    from core.sampling import HFRollout, RolloutSampler, SamplingSettings, prompt_texts

    model, tok = tiny_policy
    prompts = ["Compute 2 + 2.", "Name a colour."]
    plain = generate_with_tools(model, tok, prompt_texts(tok, prompts, True), 1, SamplingSettings(1.0, 1.0, 12), 7,
                                ToolUse({}))
    ids = plain.response_ids[0][plain.response_mask[0].bool()].tolist()
    settings = SamplingSettings(1.0, 1.0, 40)
    want = generate_with_tools(model, tok, prompt_texts(tok, prompts, True), 1, settings, 7,
                               ToolUse({"echo": _Echo(tok.decode(ids[2:4]))}, max_turns=1, max_obs_tokens=8))
    got = RolloutSampler(HFRollout(model, tok), tok).sample(prompts, 1, [7, 8], settings,
                                                            tools={"echo": _Echo(tok.decode(ids[2:4]))}, max_turns=1,
                                                            max_obs_tokens=8)
    assert [x.response for o in got for x in o] == want.texts
    assert [x.tool_calls for o in got for x in o] == want.tool_calls.tolist() and sum(want.tool_calls.tolist()) >= 1

"""Rollout loop, action parsing, and the engines (vLLM log-prob parity + weight sync on the tiny model)."""
import dataclasses
import math
import os

import pytest
import torch

from config import Config
from envs import EnvPool
from plumbing.tasks import load_tasks
from rollout import HFEngine, Reply, choice_ids, expert_reply, parse_action, rollout, user_message
from tools.bench import encode_prompt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer
    from plumbing.tiny import tiny_path
    path = tiny_path(str(tmp_path_factory.mktemp("tiny")))
    return path, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(2)
    yield p
    p.close()


def grp(task, n, R):
    """A rollout group after the first n actions of the task's expert trajectory (rollout.group)."""
    from rollout import ExpertSource, group
    return group(task, ExpertSource([task]).hint(task), n, R)


def cfg(**kw):
    return dataclasses.replace(Config(), **{"prompt": "compact", "max_prompt_tokens": 768, "max_new_tokens": 32, **kw})


@pytest.mark.parametrize("text,want", [
    ("<think>hmm</think>\n<action>go to desk 1</action>", "go to desk 1"),
    ("<action>  take   apple 1 from countertop 2 </action> trailing", "take apple 1 from countertop 2"),
    ("<action>look</action><action>inventory</action>", "look"),
    ("go to desk 1", None), ("<action>go to desk 1", None), ("go </action> <action>", None),
    ("<action></action>", None), ("<action>   </action>", None), ("</action>look<action>", None),
    ("<action>ü🙂 ☃</action>", "ü🙂 ☃"), ("\x00\xff garbage <<<>>>", None),
    ("<action>" + "x" * 10_000 + "</action>", "x" * 10_000), ("y" * 10_000, None), (None, None),
])
def test_parse_action(text, want):
    assert parse_action(text) == want


def test_over_long_reply_is_invalid():
    assert parse_action("<action>look</action>", finished=False) is None


class ScriptedEngine:
    """Test double for the engine only: replies with the expert's next action (read from the compact prompt's
    'done:' list), or with garbage."""

    def __init__(self, tok, walkthrough, garbage=False):
        self.tok, self.walk, self.garbage = tok, walkthrough, garbage

    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            done = text.split("done: ")[1].split("\n")[0]
            k = 0 if done == "-" else len(done.split(" | "))
            reply = "\x00 <action> ü🙂 unbalanced </act" * 50 if self.garbage else expert_reply(self.walk[k])
            ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id]
            out.append({"ids": ids, "logprobs": [0.0] * len(ids), "finished": True})
        return out


def test_scripted_expert_wins_and_garbage_fails(tiny, pool):
    _, tok = tiny
    for t in load_tasks("train")[:6:2]:
        out = rollout(ScriptedEngine(tok, t["walkthrough"]), pool, tok, [grp(t, 0, 3)], cfg())
        assert [e["won"] for e in out["episodes"]] == [True] * 3
        assert all(r["valid"] for r in out["rows"]) and len(out["rows"]) == 3 * t["L"]
        c = cfg(max_steps=6, invalid_penalty=0.1)
        bad = rollout(ScriptedEngine(tok, t["walkthrough"], garbage=True), pool, tok, [grp(t, 0, 2)], c, 0,
                      Reply(c))
        assert [e["won"] for e in bad["episodes"]] == [False] * 2
        assert bad["stats"]["invalid"] == 12 and all(not r["valid"] for r in bad["rows"])
        assert [e["reward"] for e in bad["episodes"]] == pytest.approx([-0.6, -0.6])


def test_prefix_in_history_counts_against_max_steps_and_aux_rows(tiny, pool):
    _, tok = tiny
    t = load_tasks("train")[1]
    n = t["L"] - 2
    out = rollout(ScriptedEngine(tok, t["walkthrough"], garbage=True), pool, tok,
                  [grp(t, n, 2)], cfg(max_steps=n + 3))
    for e in out["episodes"]:
        assert e["steps"] == n + 3
    rows = [r for r in out["rows"] if r["eid"] == out["episodes"][0]["eid"]]
    assert [r["t"] for r in rows] == [n, n + 1, n + 2]  # the policy only had the 3 steps left
    first = tok.decode(rows[0]["prompt_ids"])
    assert "done: " + " | ".join(t["walkthrough"][:n]) in first  # prefix shown as the agent's own past
    assert len(out["aux"]) == n  # one aux row per prefix step, shared by the group's R rollouts
    for k, a in enumerate(out["aux"]):
        assert tok.decode(a["response_ids"], skip_special_tokens=True) == expert_reply(t["walkthrough"][k])
        assert parse_action(tok.decode(a["response_ids"], skip_special_tokens=True)) == t["walkthrough"][k]
    # n = L - 1 with a scripted expert: the one remaining step wins
    win = rollout(ScriptedEngine(tok, t["walkthrough"]), pool, tok, [grp(t, t["L"] - 1, 1)], cfg())
    assert win["episodes"][0]["won"] and len(win["rows"]) == 1
    # each aux row carries its group's outcome: both garbage episodes lost, the one expert episode won
    assert [a["success"] for a in out["aux"]] == [0.0] * n
    assert [a["success"] for a in win["aux"]] == [1.0] * (t["L"] - 1)


def test_prompt_truncated_from_left_and_counted(tiny):
    _, tok = tiny
    msg = user_message("put a mug in the sink.", "room", [("obs", "look")] * 200, "now", ["look"], 200, cfg())
    ids, tr = encode_prompt(tok, msg, 64)
    assert tr and len(ids) == 64
    full, _ = encode_prompt(tok, msg, 10**6)
    assert ids == full[-64:]


def test_full_prompt_has_history_window_and_tags(tiny):
    c = dataclasses.replace(Config(), history_length=2)
    msg = user_message("heat an egg.", "room", [("o1", "a1"), ("o2", "a2"), ("o3", "a3")], "o4", ["look", "go to x 1"],
                       3, c)
    assert "o1" not in msg and "[Observation 2] o2" in msg and "[Action 3] a3" in msg
    assert "<think>" in msg and "<action>" in msg and "look, go to x 1" in msg and "3 step(s)" in msg


def test_hf_rollouts_same_seed_same_result(tiny, pool):
    path, tok = tiny
    eng = HFEngine(path, tok)
    t = load_tasks("train")[0]
    c = cfg(max_steps=4, constrained=True)
    a = rollout(eng, pool, tok, [grp(t, 1, 3)], c, seed=7)
    b = rollout(eng, pool, tok, [grp(t, 1, 3)], c, seed=7)
    assert [r["response_ids"] for r in a["rows"]] == [r["response_ids"] for r in b["rows"]]
    assert all(r["valid"] for r in a["rows"])  # constrained decoding: only admissible commands
    other = rollout(eng, pool, tok, [grp(t, 1, 3)], c, seed=8)
    assert [r["response_ids"] for r in a["rows"]] != [r["response_ids"] for r in other["rows"]]


def teacher_forced(model, prompt, resp):
    x = torch.tensor([prompt + resp])
    with torch.no_grad():
        lp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
    return lp[len(prompt) - 1:].gather(-1, torch.tensor(resp)[:, None])[:, 0]


@pytest.fixture(scope="module")
def vllm_eng(tiny):
    """One vLLM engine per test module: a second LLM in the same process would find torch.distributed already
    initialised (by the first) and ask for torchrun's variables. Tests that change its weights put them back."""
    path, tok = tiny
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        if os.environ.get("REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM cannot import here: {e}")
    from rollout import VLLMEngine
    return VLLMEngine(path, tok, seed=0, dtype="float32", max_model_len=1024)


def test_vllm_logprobs_match_transformers_and_follow_weight_sync(tiny, vllm_eng):
    from transformers import AutoModelForCausalLM
    path, tok = tiny
    eng = vllm_eng
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [encode_prompt(tok, f"task: put a mug {i} in the sink.\noptions: look", 512)[0] for i in range(4)]

    def max_err():
        outs = eng.generate(prompts, 12, 1.0, seed=3)
        return max((teacher_forced(model, p, o["ids"]) - torch.tensor(o["logprobs"])).abs().max().item()
                   for p, o in zip(prompts, outs))
    assert max_err() < 1e-4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = -model(torch.tensor([prompts[0]])).logits.log_softmax(-1)[0, :, 5].mean()
    loss.backward()
    opt.step()
    outs = eng.generate(prompts, 12, 1.0, seed=3)
    stale = max((teacher_forced(model, p, o["ids"]) - torch.tensor(o["logprobs"])).abs().max().item()
                for p, o in zip(prompts, outs))
    assert stale > 1e-3  # the engine still has the old weights: the check can fail
    eng.load_weights(model.state_dict().items())
    assert max_err() < 1e-4
    eng.load_weights(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict().items())


NAN_GENERATE = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from rollout import HFEngine, VLLMEngine, chat_ids, choice_ids
path, which = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
eng = HFEngine(path, tok) if which == "hf" else VLLMEngine(path, tok, seed=0, dtype="float32", max_model_len=1024)
clean = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
eng.load_weights((k, torch.full_like(v, float("nan"))) for k, v in clean.items())
prompts = [chat_ids(tok, f"task: put a mug {i} in the sink.") for i in range(4)]
out = []
for temp in (1.0, 0.0):
    for allowed in (None, [choice_ids(tok, ["look", "go to sink 1"])] * 4):
        t0 = time.time()
        try:
            lens = [len(o["ids"]) for o in eng.generate(prompts, 12, temp, seed=3, allowed=allowed)]
            out.append({"temp": temp, "lens": lens, "s": time.time() - t0})
        except RuntimeError as e:
            out.append({"temp": temp, "error": str(e)[:200], "s": time.time() - t0})
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("which", ["hf", "vllm"])
def test_generation_on_non_finite_weights_ends_within_its_budget(tiny, which):
    """Weights that are all NaN (a diverged update, which train.py stops before any sync) never hang an
    engine: greedy and sampled, free and constrained, each call returns replies of at most max_new_tokens or
    raises at once (HF's sampler refuses NaN probabilities). Each engine in a process of its own: the module's
    shared vLLM engine, given NaN weights and then its weights back, failed this file's later vLLM tests."""
    import json
    import subprocess
    import sys
    if which == "vllm" and os.environ.get("REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", NAN_GENERATE, tiny[0], which], cwd=root, capture_output=True,
                       text=True, timeout=600)
    got = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and got, p.stderr[-3000:]
    for r in got[0]:
        assert r["s"] < 60
        if "error" in r:
            assert which == "hf" and r["temp"] > 0 and "probability tensor" in r["error"], r
        else:
            assert len(r["lens"]) == 4 and max(r["lens"]) <= 12, r


WEBSHOP_CMDS = [["search[<query>]"], ["search[<query>]", "click[b0abcdef12]", "click[next >]"]] * 3


@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_constrained_logprobs_agree_across_engines_and_trainer(tiny, request, env):
    """Under constrained decoding vLLM, HF and the trainer use one distribution: the policy restricted to the
    admissible-reply trie (with WebShop's free-text search slot: after '<action>search[' the whole vocabulary).
    Every reply is a canonical admissible reply or a search, and all three log-probs agree (1e-4)."""
    from grpo import FREE, response_logprobs
    from rollout import choice_ids
    path, tok = tiny
    hf = HFEngine(path, tok)
    cmds = [["go to desk 1", "go to desk 2", "take mug 1 from desk 1", "look"],
            ["open fridge 1", "go to fridge 1", "inventory"]] * 3 if env == "alfworld" else WEBSHOP_CMDS
    allowed = [choice_ids(tok, c) for c in cmds]
    free = [s[:-1] for s in allowed[0] if s[-1] == FREE]
    searched = 0
    prompts = [encode_prompt(tok, f"task: put a mug in the sink.\nnow: you see desk {i}", 512)[0]
               for i in range(len(cmds))]
    engines = [("hf", hf)]
    try:
        engines.append(("vllm", request.getfixturevalue("vllm_eng")))
    except pytest.skip.Exception:
        pass
    greedy = {}
    for name, eng in engines:
        for temp in (1.0, 0.7, 0.0):
            outs = eng.generate(prompts, 32, temp, seed=5, allowed=allowed)
            for p, o, al in zip(prompts, outs, allowed):
                is_search = bool(free) and o["ids"][:len(free[0])] == free[0]
                searched += is_search
                assert is_search or (o["ids"] in al and o["finished"]), (name, temp)  # a canonical admissible reply
                row = {"prompt_ids": p, "response_ids": o["ids"], "allowed": al}
                with torch.no_grad():
                    lp = response_logprobs(hf.model, [row], tok.pad_token_id, "cpu", temp if temp > 0 else 1.0)[0][0]
                assert (lp - torch.tensor(o["logprobs"])).abs().max().item() < 1e-4, (name, temp)
            if temp == 0.0:
                greedy[name] = outs
    assert searched >= (len(engines) * 3 * 3 if env == "webshop" else 0)  # the search-only prompts searched
    if "vllm" in greedy:  # same greedy replies and log-probs from both engines
        for a, b in zip(greedy["hf"], greedy["vllm"]):
            assert a["ids"] == b["ids"]
            assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4


def test_expert_targets_follow_the_constrained_paths(tiny):
    """Aux/SFT targets are replies the constrained decoder can produce: every token stays in the trie (a search's
    '<action>search[' start tokenised on its own, then the free query)."""
    from plumbing.webshop import SEARCH_ACTION
    from grpo import trie_options
    from rollout import choice_ids, expert_ids
    _, tok = tiny
    for action, cmds in [("search[red cotton t-shirt]", [SEARCH_ACTION, "click[b0abcdef12]"]),
                         ("click[b0abcdef12]", [SEARCH_ACTION, "click[b0abcdef12]", "click[next >]"]),
                         ("go to desk 1", ["go to desk 1", "look"])]:
        ids = expert_ids(tok, action)
        assert tok.decode(ids, skip_special_tokens=True) == expert_reply(action) and ids[-1] == tok.eos_token_id
        opts = trie_options(ids, choice_ids(tok, cmds))
        assert all(o is None or t in o for o, t in zip(opts, ids)), action


def test_quiet_vllm_drops_only_the_listed_notices():
    """--vllm_log quiet: the CPU build's start-up notices are dropped at their own loggers; any other warning of
    the same logger, and every message of other loggers, still passes."""
    import logging

    from plumbing.vllm_log import VLLM_NOISE, quiet_vllm
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    name = "vllm.v1.worker.cpu_worker"
    lg, h = logging.getLogger(name), Keep()
    lg.addHandler(h)
    try:
        quiet_vllm()
        quiet_vllm()  # idempotent: one filter per logger
        assert sum(type(f).__name__ == "DropNotices" for f in lg.filters) == 1
        lg.warning("libtcmalloc is not found in LD_PRELOAD. For best performance ...")
        lg.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        lg.warning("Not enough KV cache: 3 blocks")
        assert seen == ["Not enough KV cache: 3 blocks"]
        assert "libtcmalloc is not found" in VLLM_NOISE[name]
    finally:
        lg.removeHandler(h)


def test_entropy_term_keeps_no_extra_vocab_sized_tensor(tiny):
    """One micro-batch's loss on the tiny model: the bytes autograd saves for the backward (counted once per
    storage with saved_tensors_hooks), without and with the entropy term. By hand: the log-probs alone keep one
    fp32 [rows, tokens, vocab] tensor (4 b n V bytes); the entropy from the same log_softmax adds [rows, tokens]
    tensors only, far below a quarter of one such tensor (a second copy of the logits would add 4 b n V)."""
    from types import SimpleNamespace
    from transformers import AutoModelForCausalLM
    from grpo import Entropy, policy_loss, response_logprobs
    path, tok = tiny
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    replies = ["<action>look</action>", "<think>go</think><action>go to desk 1</action>", "<action>inventory</action>"]
    rows = [{"prompt_ids": tok.encode(f"task: put a mug in the sink {i}"),
             "response_ids": tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]} for i, r in enumerate(replies)]
    b, n, V = len(rows), max(len(r["response_ids"]) for r in rows), m.config.vocab_size

    def saved_bytes(entropy):
        kept = {}

        def pack(t):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = response_logprobs(m, rows, tok.pad_token_id, "cpu", 1.0, entropy)
            loss, _ = policy_loss(out[0], out[0].detach(), torch.tensor([1.0, -1.0, 0.5]), out[1], torch.full((b,), 0.1),
                                  0.2)
            if entropy:  # the entropy bonus, as the update adds it (grpo.Entropy)
                mb = SimpleNamespace(entropy=out[2], mask=out[1], weights=lambda agg: torch.full((b,), 0.1))
                loss = loss + Entropy(SimpleNamespace(entropy_coef=0.01, loss_agg="token-mean"))(mb)[0]
        loss.backward()  # the saved tensors were what the backward needed
        return sum(kept.values())
    vocab_tensor = 4 * b * n * V
    without, with_entropy = saved_bytes(False), saved_bytes(True)
    assert without > vocab_tensor  # the counter sees the log-probs' [b, n, V] input (and the model's own)
    assert with_entropy - without < vocab_tensor / 4, (with_entropy - without, vocab_tensor)


def test_hf_engine_samples_the_distribution_the_trainer_scores(tiny, tmp_path):
    """A model whose generation_config asks for repetition_penalty 1.3 (Qwen2.5-Instruct sets 1.05, top_k 20,
    top_p 0.8): the HF engine must not apply it. Its greedy replies are the argmax of the trainer's (raw) logits
    at every position, and its sampled log-probs are the trainer's."""
    import shutil
    import json as _json
    from transformers import AutoModelForCausalLM
    path, tok = tiny
    d = tmp_path / "penalised"
    shutil.copytree(path, d)
    gc = _json.load(open(d / "generation_config.json"))
    _json.dump({**gc, "repetition_penalty": 1.3, "top_k": 5, "top_p": 0.5, "do_sample": True},
               open(d / "generation_config.json", "w"))
    eng = HFEngine(str(d), tok)
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    prompts = [encode_prompt(tok, f"task: put a {o} in the fridge\nnow: You are in a kitchen.", 256)[0]
               for o in ("apple", "egg", "mug")]
    for o, p in zip(eng.generate(prompts, 40, 0.0, seed=0), prompts):
        x = torch.tensor([p + o["ids"]])
        with torch.no_grad():
            logits = model(x).logits[0, len(p) - 1:-1]
        assert logits.argmax(-1).tolist() == o["ids"]  # a penalty would move some argmax of a repeating reply
    for o, p in zip(eng.generate(prompts, 24, 1.0, seed=3), prompts):
        assert torch.tensor(o["logprobs"]) == pytest.approx(teacher_forced(model, p, o["ids"]), abs=1e-4)


def test_hf_engine_takes_the_weights_one_at_a_time(tiny):
    """load_weights consumes its (name, tensor) stream lazily, as the vLLM sync does (under FSDP each tensor is
    gathered for its copy alone), and refuses a stream that leaves a tensor out."""
    from transformers import AutoModelForCausalLM
    path, tok = tiny
    eng = HFEngine(path, tok)
    src = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(1.0)
    order = []

    def stream():
        prev = None
        for k, v in src.state_dict().items():
            if prev is not None:  # the engine copied the previous tensor before asking for this one
                order.append(torch.equal(eng.tensors[prev], src.state_dict()[prev]))
            prev = k
            yield k, v
    eng.load_weights(stream())
    assert order and all(order)
    with pytest.raises(KeyError, match="no tensor for"):
        eng.load_weights(list(src.state_dict().items())[1:])


def test_an_over_long_prompt_drops_its_oldest_history_first(tiny):
    """fit_prompt on a built-up history (full prompt, 10 past steps shown): over the budget it shows fewer past
    steps, oldest first gone, and keeps the task sentence and the current observation; the budget is measured with
    the tokenizer on the messages with 3 and 4 past steps, so exactly the 3 newest must stay."""
    from rollout import chat_ids, fit_prompt
    _, tok = tiny
    c = cfg(prompt="full", history_length=10)
    hist = [(f"You arrive at shelf {j}. On the shelf {j}, you see a mug {j} and a vase {j}.", f"go to shelf {j + 1}")
            for j in range(10)]
    task, obs, adm = "put a clean mug in the coffeemachine.", "You arrive at sinkbasin 1.", ["look", "go to desk 1"]
    three = chat_ids(tok, user_message(task, "", hist[-3:], obs, adm, 10, c))
    four = chat_ids(tok, user_message(task, "", hist[-4:], obs, adm, 10, c))
    assert len(three) < len(four)
    ids, truncated = fit_prompt(tok, task, "", hist, obs, adm, 10, dataclasses.replace(c, max_prompt_tokens=len(three)))
    assert truncated and ids == three
    text = tok.decode(ids)
    assert "Your task is to: put a clean mug in the coffeemachine." in text and "sinkbasin 1" in text
    assert "shelf 9" in text and "shelf 7." in text and "shelf 6." not in text  # the 3 newest past steps
    ids, truncated = fit_prompt(tok, task, "", hist, obs, adm, 10, c)  # within the default budget: all 10 shown
    assert not truncated and ids == chat_ids(tok, user_message(task, "", hist, obs, adm, 10, c))
    ids, truncated = fit_prompt(tok, task, "", [], obs * 200, adm, 0, dataclasses.replace(c, max_prompt_tokens=100))
    assert truncated and len(ids) == 100  # no history left: the middle goes, the head keeps the task
    assert "Your task is to:" in tok.decode(ids[:25])


@pytest.mark.parametrize("reply, lower, think, want", [
    ("<think>ok</think>\n<action>go to desk 1</action>", False, False, ("go to desk 1", True)),
    ("<action>Go To Desk 1</action>", False, False, ("Go To Desk 1", True)),            # case kept (CPU presets)
    ("<action>Go To Desk 1</action>", True, False, ("go to desk 1", True)),             # the authors: lower-cased
    ("<action>go to desk 1</action>", False, True, ("go to desk 1", False)),            # no think: played, invalid
    ("<think>hm</think><action>look</action><action>inventory</action>", True, True, ("look", True)),  # first tag
    ("<think>想</think><action>look</action>", False, True, ("look", False)),           # a CJK character: invalid
    ("<think>no action</think>", True, True, (None, False)),
])
def test_replies_read_as_the_authors_read_them(reply, lower, think, want):
    """rollout.Reply under --parse_lower / --parse_think (the authors' projection; both off: parse_action)."""
    assert Reply(cfg(parse_lower=lower, parse_think=think)).read(reply, True) == want


def test_expert_targets_carry_the_thinks_the_prompt_asks_for(tiny, pool):
    """Aux targets: under the full prompt "<think>{think}</think>\\n<action>{a}</action>" + EOS, the expert's think
    where the task has one (the authors' expert data) and an empty one otherwise; under the compact prompt the action
    tag alone. Each aux row knows its prefix's length n."""
    _, tok = tiny
    t = load_tasks("train")[1]
    thinks = [f"step {j} makes sense." for j in range(t["L"])]
    full = cfg(prompt="full", max_prompt_tokens=2048)
    for task, want in (({**t, "thinks": thinks}, thinks), (t, [""] * t["L"])):
        out = rollout(ScriptedEngine(tok, t["walkthrough"], garbage=True), pool, tok, [grp(task, 3, 2)],
                      dataclasses.replace(full, max_steps=3))  # the prefix fills the budget: no policy turn
        assert [a["n"] for a in out["aux"]] == [3, 3, 3]
        for k, a in enumerate(out["aux"]):
            assert a["response_ids"][-1] == tok.eos_token_id
            assert tok.decode(a["response_ids"][:-1]) == f"<think>{want[k]}</think>\n<action>{t['walkthrough'][k]}</action>"
    out = rollout(ScriptedEngine(tok, t["walkthrough"], garbage=True), pool, tok,
                  [grp({**t, "thinks": thinks}, 2, 1)], cfg(max_steps=3))  # compact
    assert [tok.decode(a["response_ids"][:-1]) for a in out["aux"]] == [f"<action>{a}</action>" for a in t["walkthrough"][:2]]


def test_aux_loss_weighting_token_mean_and_the_authors_prefix_mean(tiny):
    """L_aux on three expert rows: two of a 2-step prefix, one of a 1-step prefix. token-mean (paper preset): every
    expert token weighs the same, -eta sum lp / tokens. prefix-mean (released, the authors' prefix SFT): each row's
    token mean, weight 1/n, over the weights: -eta (m1 / 2 + m2 / 2 + m3 / 1) / (1/2 + 1/2 + 1)."""
    from transformers import AutoModelForCausalLM
    from rollout import expert_ids
    from grpo import MicroBatch, make_terms, response_logprobs, terms_loss
    path, tok = tiny
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    acts = ["go to desk 1", "take mug 1 from desk 1", "look"]
    rows = [{"prompt_ids": tok.encode(f"task {j}"), "response_ids": expert_ids(tok, a), "n": n}
            for j, (a, n) in enumerate(zip(acts, (2, 2, 1)))]
    with torch.no_grad():
        lp, mask = response_logprobs(m, rows, tok.pad_token_id)
    sums, lens = (lp * mask).sum(-1).tolist(), mask.sum(-1).tolist()
    counts = {"aux_tokens": sum(lens), "aux_weight": 0.5 + 0.5 + 1.0}
    for agg, want in (("token-mean", -0.5 * sum(sums) / sum(lens)),
                      ("prefix-mean", -0.5 * (sums[0] / lens[0] / 2 + sums[1] / lens[1] / 2 + sums[2] / lens[2]) / 2.0)):
        aux_terms = [t for t in make_terms(cfg(eta=0.5, aux_agg=agg)) if t.rows == "aux"]
        parts = {"aux": 0.0}
        with torch.no_grad():  # train.py's micro-batch: the log-probs, then the terms that read aux rows
            loss = terms_loss(aux_terms, MicroBatch(rows, *response_logprobs(m, rows, tok.pad_token_id), None,
                                                    counts, {}), parts)
        assert loss.item() == pytest.approx(want, rel=1e-5), agg
        assert parts["aux"] == pytest.approx(want / 0.5, rel=1e-5)  # logged without the weight eta


class QueueEngine:
    """Test double for the engine only: replies with the next action of a fixed list, one prompt a call."""

    def __init__(self, tok, actions):
        self.tok, self.actions = tok, list(actions)

    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        assert len(prompts) == 1
        ids = self.tok.encode(expert_reply(self.actions.pop(0)), add_special_tokens=False) + [self.tok.eos_token_id]
        return [{"ids": ids, "logprobs": [0.0] * len(ids), "finished": True}]


def test_episodes_carry_what_was_played_and_a_self_source_replays_it(tiny, pool):
    """An episode's "played" holds the replayed prefix and the actions the game took after it: a well-formed
    action the game refuses (not admissible, nothing changes) is left out. A self source keeps that win as the
    task's hint, and replaying all but its last action leaves one step to win."""
    from rollout import ExpertSource, Hint, group
    from variants.hints import SelfSource
    _, tok = tiny
    t = next(t for t in load_tasks("train") if t["L"] >= 4)
    n = 2
    out = rollout(QueueEngine(tok, ["fly to the moon"] + t["walkthrough"][n:]), pool, tok,
                  [group(t, ExpertSource([t]).hint(t), n, 1)], cfg())
    episode = out["episodes"][0]
    assert episode["won"] and episode["invalid"] == 1 and episode["steps"] == t["L"] + 1
    assert episode["played"] == t["walkthrough"]
    source = SelfSource()
    assert source.observe(out["episodes"]) == [t["id"]]
    assert source.hint(t) == Hint(t["walkthrough"], [])
    L = len(source.hint(t).actions)
    replay = group(t, source.hint(t), L - 1, 1)
    assert replay["prefix"] == t["walkthrough"][:-1] and replay["thinks"] == []
    win = rollout(QueueEngine(tok, t["walkthrough"][-1:]), pool, tok, [replay], cfg())
    assert win["episodes"][0]["won"] and win["episodes"][0]["steps"] == L


# ---- a hint's text reaches the prompt; the reply rule
class Recorder:
    """Test double for the engine only: replies 'look' to every prompt."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        ids = self.tok.encode(expert_reply("look"), add_special_tokens=False) + [self.tok.eos_token_id]
        return [{"ids": ids, "logprobs": [0.0] * len(ids), "finished": True} for _ in prompts]


@pytest.mark.parametrize("style, line", [("full", "Hint: first go to countertop 1"),
                                         ("compact", "hint: first go to countertop 1")])
def test_a_hints_text_reaches_every_prompt_of_its_group_and_no_text_changes_nothing(tiny, pool, style, line):
    """Two groups of one task after the same 2-step prefix, one hint with a text, one without: every prompt of
    the first (its policy turns and its aux rows) shows the text on the line after the task; the second's
    prompts are the first's without that line, i.e. what the prompt is without hints."""
    from rollout import ExpertSource, group
    _, tok = tiny
    t = load_tasks("train")[1]
    h = ExpertSource([t]).hint(t)
    c = cfg(prompt=style, max_prompt_tokens=2048, max_steps=4)
    out = rollout(Recorder(tok), pool, tok, [group(t, h._replace(text=line.split(": ", 1)[1]), 2, 2),
                                             group(t, h, 2, 2)], c)
    with_text = [tok.decode(r["prompt_ids"]) for k in ("aux", "rows") for r in out[k] if r["gid"] == 0]
    without = [tok.decode(r["prompt_ids"]) for k in ("aux", "rows") for r in out[k] if r["gid"] == 1]
    assert len(with_text) == len(without) == 2 + 2 * 2  # 2 aux rows, then 2 turns x 2 episodes
    for a, b in zip(with_text, without):
        lines = a.splitlines()
        k = next(i for i, x in enumerate(lines) if "Your task is to:" in x or "task: " in x)
        assert lines[k + 1] == line
        assert line not in b and a.replace(line + "\n", "", 1) == b


def test_user_message_without_a_hint_text_is_the_prompt_without_hints():
    """hint="" (every shipped source) adds nothing: the message, byte for byte, is the one without the
    argument, for both prompts; a text adds exactly one line after the task line."""
    hist, adm = [("o1", "a1"), ("o2", "a2")], ["look", "go to desk 1"]
    for c in (cfg(prompt="full"), cfg(prompt="compact"), cfg(prompt="compact", constrained=True)):
        plain = user_message("heat an egg.", "room", hist, "o3", adm, 2, c)
        assert user_message("heat an egg.", "room", hist, "o3", adm, 2, c, "") == plain
        hinted = user_message("heat an egg.", "room", hist, "o3", adm, 2, c, "first go to countertop 1")
        lines = hinted.splitlines()
        assert lines[1] in ("Hint: first go to countertop 1", "hint: first go to countertop 1")
        assert "\n".join(lines[:1] + lines[2:]) == plain


def test_a_group_carries_its_hints_text_and_a_text_only_hint_replays_nothing():
    from rollout import Hint, group
    task = {"id": "t", "walkthrough": ["go", "take"]}
    assert group(task, Hint(["go", "take"], ["why"]), 1, 2) == {"task": task, "n": 1, "R": 2,
                                                              "prefix": ["go"], "thinks": ["why"], "text": ""}
    assert group(task, Hint([], [], "look first"), 0, 2)["text"] == "look first"
    assert group(task, None, 0, 2) == {"task": task, "n": 0, "R": 2, "prefix": [], "thinks": [], "text": ""}
    with pytest.raises(ValueError, match="a prefix of 1 steps, but its hint has 0"):
        group(task, Hint([], [], "look first"), 1, 2)


def test_the_reply_rule_follows_its_flags():
    """rollout.Reply: at the defaults the 0/1 outcome on every step row ('traj'); under the paper / released
    presets' flags, reward_scale * won - invalid_penalty * invalid steps, on every row (traj) or won minus the
    row's own penalty (step), worked by hand."""
    from config import get_config
    from rollout import Episode

    def ep(won, invalid):  # a finished episode: a row per turn, `invalid` of them invalid
        return Episode(0, 0, {}, 0, [], [], "", won=won, invalid=sum(invalid), rows=[{"valid": not b} for b in invalid])
    plain = Reply(cfg()).rewards
    assert plain.adv_level == "traj"
    for won, invalid in ((True, [False, True, False]), (False, [True, True]), (True, []), (False, [False])):
        assert plain.episode(ep(won, invalid)) == float(won)
        assert plain.rows(ep(won, invalid), float(won)) == [float(won)] * len(invalid)
    paper = get_config(["--preset", "paper"])
    r = Reply(paper)
    assert (r.lower, r.think, r.rewards.adv_level) == (True, True, paper.adv_level)
    assert r.rewards.episode(ep(True, [True, True])) == paper.reward_scale - 2 * paper.invalid_penalty
    released = Reply(get_config(["--preset", "released"])).rewards  # reward_scale 10, invalid_penalty 0.1, step
    assert released.episode(ep(True, [True, True])) == pytest.approx(9.8)
    for won, invalid, want in ((True, [False, True], [10.0, 9.9]), (False, [True, True], [-0.1, -0.1])):
        e = ep(won, invalid)
        assert released.rows(e, released.episode(e)) == pytest.approx(want)


def test_a_turns_prompts_tokenised_at_once_are_the_prompts_one_at_a_time(tiny):
    """fit_prompts (one batch call of the chat template) gives each turn what fit_prompt gives it alone, an
    over-long prompt included (it goes through fit_prompt's loop); chat_ids_batch is chat_ids per message, which is
    the template's own tokenize=True."""
    from rollout import chat_ids, chat_ids_batch, fit_prompt, fit_prompts
    _, tok = tiny
    c = cfg(prompt="full", history_length=10, max_prompt_tokens=230)
    hist = [(f"You arrive at shelf {j}. On the shelf {j}, you see a mug {j}.", f"go to shelf {j + 1}")
            for j in range(6)]
    adm = ["look", "go to desk 1"]
    turns = [("put a mug in the sink.", "", hist[:k], f"You arrive at sinkbasin {k}.", adm, k, "", ())
             for k in (0, 2, 6)]
    turns.append(("put a mug in the sink.", "", hist[:1], "You arrive at sinkbasin 1.", adm, 1, "open the door", ()))
    got = fit_prompts(tok, turns, c)
    assert got == [fit_prompt(tok, *t[:6], c, *t[6:]) for t in turns]
    assert [tr for _, tr in got] == [False, False, True, False]  # the 6-step history is over 230 tokens
    msgs = [user_message(*t[:6], c, *t[6:]) for t in turns]
    want = [list(tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for m in msgs]
    assert chat_ids_batch(tok, msgs) == want == [chat_ids(tok, m) for m in msgs]
    assert fit_prompts(tok, [], c) == []


def test_admissible_replies_are_tokenised_once_and_reach_vllm_as_one_string(tiny):
    """choice_ids: the reply of every command, '<action>c</action>' + EOS as the tokenizer encodes it, a fresh list
    each call though each command is tokenised once; allowed_arg / allowed_trie carry those sequences to the trie
    mask unchanged (the trie's options are trie_options' on the lists)."""
    import json
    from grpo import trie_options
    from plumbing.trie_mask import allowed_arg, allowed_trie
    from rollout import _choice, choice_ids
    _, tok = tiny
    cmds = ["go to desk 1", "look", "take mug 1 from desk 1"]
    want = [tok.encode(f"<action>{c}</action>", add_special_tokens=False) + [tok.eos_token_id] for c in cmds]
    a = choice_ids(tok, cmds)
    assert a == want and all(type(x) is list for x in a)
    a[0].append(-5)  # the caller's list: the cache is not touched
    assert choice_ids(tok, cmds) == want and _choice.cache_info().hits >= 3
    arg = allowed_arg(want)
    assert isinstance(arg, str) and json.loads(arg) == want
    for reply in want:
        for j in range(len(reply) + 1):
            part = reply[:j] + [-1]
            assert trie_options(part, allowed_trie(arg))[-1] == trie_options(part, want)[-1]


def test_constrained_aux_rows_are_scored_on_the_trie_the_policy_plays(tiny, pool):
    """Under --constrained each aux row carries its prefix step's admissible commands (choice_ids) and the update's
    aux stat on that fixed batch is the trie-restricted NLL at the rollout temperature, written out here from a
    plain forward pass: at each target position the softmax of logits / T over the tokens that continue some
    admissible reply. Unconstrained rows carry none; the SFT player drops them (SFT fits the whole vocabulary)."""
    import copy
    from transformers import AutoModelForCausalLM
    from config import get_config
    from grpo import MicroBatch, make_terms, response_logprobs, terms_loss
    from rollout import choice_ids
    from train_update import Learner
    from variants.players import SFTPlayer
    path, tok = tiny
    t = next(t for t in load_tasks("train") if t["L"] >= 4)
    c = dataclasses.replace(get_config(["--preset", "cpu_pick2"]), max_steps=3, temperature=0.7)
    out = rollout(ScriptedEngine(tok, t["walkthrough"]), pool, tok, [grp(t, 3, 2)], c)
    aux = out["aux"]
    assert len(aux) == 3 and not out["rows"]  # the prefix fills the budget: no policy turn
    env = __import__("envs").AlfEnv()
    steps = env.reset(t["gamefile"], t["walkthrough"][:3])["prefix_steps"]
    for a, (_, adm, act) in zip(aux, steps):
        assert a["allowed"] == choice_ids(tok, adm) and a["response_ids"] in a["allowed"]
    plain = rollout(ScriptedEngine(tok, t["walkthrough"]), pool, tok, [grp(t, 3, 2)],
                    dataclasses.replace(c, constrained=False))
    assert [a["response_ids"] for a in plain["aux"]] == [a["response_ids"] for a in aux]
    assert not any("allowed" in a for a in plain["aux"])
    sft = SFTPlayer(ScriptedEngine(tok, t["walkthrough"]), pool, tok, dataclasses.replace(c, mode="sft_prefix"))
    assert not any("allowed" in a for a in sft.play(0, [t], [expert_hint(t)], [3])["aux"])
    # the update's aux stat on this batch against the NLL written out
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    learn = Learner(c, copy.deepcopy(m), torch.optim.AdamW(m.parameters()), tok)
    with torch.no_grad():
        nll = full = 0.0
        for a in aux:
            ids = torch.tensor([a["prompt_ids"] + a["response_ids"]])
            z = m(input_ids=ids).logits[0, len(a["prompt_ids"]) - 1:-1] / 0.7  # [T, V] predicting the response
            for j, y in enumerate(a["response_ids"]):
                keep = sorted({s[j] for s in a["allowed"] if s[:j] == a["response_ids"][:j]})
                nll -= (z[j, y] - torch.logsumexp(z[j, keep], -1)).item()
                full -= torch.log_softmax(z[j], -1)[y].item()
    n_tok = sum(len(a["response_ids"]) for a in aux)
    stats = {"aux": 0.0}
    with torch.no_grad():
        lp, mask = response_logprobs(m, aux, tok.pad_token_id, temperature=0.7, pack=c.pack_tokens)
        terms_loss([t for t in make_terms(c) if t.rows == "aux"],
                   MicroBatch(aux, lp, mask, None, {"aux_tokens": n_tok, "aux_weight": 1.0}, {}), stats)
    assert stats["aux"] == pytest.approx(nll / n_tok, rel=1e-5)
    assert nll < full  # the restriction removes mass the constrained policy can never emit
    assert learn.batch([], aux)["aux"] == pytest.approx(nll / n_tok, rel=1e-5)  # the logged stat, one step


def expert_hint(task):
    from rollout import ExpertSource
    return ExpertSource([task]).hint(task)


def test_row_streams_draw_from_the_softmax_by_hand():
    """RowStreams (--sample_streams episode on the HF engine): argmax(logits / T + Gumbel noise) is a draw from
    softmax(logits / T). Logits (0, ln 2, ln 3, -inf) at T = 1 give probabilities 1/6, 2/6, 3/6, 0; 6,000 rows,
    one stream each, hit them within 0.03 (4 standard errors). At T = 0.5 the logits double: 1/14, 4/14, 9/14.
    The same seed and position give the same draw, whatever the other rows."""
    from plumbing.streams import RowStreams
    z = torch.tensor([0.0, math.log(2), math.log(3), float("-inf")]).repeat(6000, 1)  # [6000, 4]
    ids = torch.zeros(6000, 7, dtype=torch.long)  # prompts of 5 tokens, reply position j = 2
    for T, want in ((1.0, [1 / 6, 2 / 6, 3 / 6, 0]), (0.5, [1 / 14, 4 / 14, 9 / 14, 0])):
        pick = RowStreams(list(range(6000)), 5, T)(ids, z).argmax(-1)
        freq = torch.bincount(pick, minlength=4).double() / 6000
        assert all(abs(f - w) < 0.03 for f, w in zip(freq.tolist(), want)), (T, freq)
        assert freq[3] == 0  # a masked token is never drawn
    alone = RowStreams([17], 5, 1.0)(ids[:1], z[:1]).argmax(-1)
    assert alone.item() == RowStreams(list(range(6000)), 5, 1.0)(ids, z).argmax(-1)[17].item()


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_per_request_streams_give_the_same_samples_however_batched(tiny, engine, request):
    """generate with a seed per request: the same prompt and seed give the same reply and log-probs alone, in a
    batch, or in the batch reversed (HF: RowStreams; vLLM: SamplingParams.seed); and through submit / poll
    (--overlap) with half the requests submitted while the engine is already decoding the others."""
    path, tok = tiny
    eng = HFEngine(path, tok) if engine == "hf" else request.getfixturevalue("vllm_eng")
    prompts = [encode_prompt(tok, f"task: put a mug {i} in the sink.\noptions: look", 512)[0][:20 + 7 * i]
               for i in range(6)]
    seeds = [1000 + 7 * i for i in range(6)]
    batch = eng.generate(prompts, 10, 1.0, seeds)
    alone = [eng.generate([p], 10, 1.0, [s])[0] for p, s in zip(prompts, seeds)]
    rev = eng.generate(prompts[::-1], 10, 1.0, seeds[::-1])[::-1]
    first = eng.submit(prompts[:3], 10, 1.0, seeds[:3])
    got = dict(eng.poll())  # vLLM: one engine step (the three prefills); HF: all three replies
    later = eng.submit(prompts[3:], 10, 1.0, seeds[3:])
    while len(got) < 6:
        got.update(eng.poll())
    polled = [got[h] for h in first + later]
    assert len(set(first + later)) == 6 and not eng.poll()  # each request answered once
    for a, b, c, d in zip(batch, alone, rev, polled):
        assert a["ids"] == b["ids"] == c["ids"] == d["ids"]
        for o in (b, d):
            assert torch.allclose(torch.tensor(a["logprobs"]), torch.tensor(o["logprobs"]), atol=1e-4)
    assert len({tuple(o["ids"]) for o in batch}) > 1  # the streams differ from one another


def test_an_episode_samples_the_same_whatever_shares_its_batch(tiny, pool):
    """--sample_streams episode: a group's episodes (keyed by their group's key and rollout index) play the same
    turns alone or beside another group, listed first or last; without keys (or --sample_streams engine) they
    draw from the engine's stream, which the batch changes."""
    path, tok = tiny
    eng = HFEngine(path, tok)
    a, b = load_tasks("train")[:2]
    c = cfg(constrained=True, sample_streams="episode", max_steps=4)
    ga, gb = {**grp(a, 1, 2), "key": ("train", 0, 5, 0)}, {**grp(b, 1, 2), "key": ("train", 0, 5, 1)}

    def turns(out, gid):
        return [(e["played"], e["won"], [r["response_ids"] for r in out["rows"] if r["eid"] == e["eid"]])
                for e in out["episodes"] if e["gid"] == gid]
    alone = turns(rollout(eng, pool, tok, [gb], c), 0)
    assert alone == turns(rollout(eng, pool, tok, [ga, gb], c), 1) == turns(rollout(eng, pool, tok, [gb, ga], c), 0)
    assert len(alone) == 2 and alone[0] != alone[1]  # rollout 0 and 1 of a group: two streams


def test_overlap_asks_the_engine_while_the_workers_step_and_plays_the_same_episodes(tiny, pool):
    """--overlap 1: each reply goes to the workers as the engine finishes it and each next prompt is submitted as
    its observation comes back, so the engine works while other episodes' steps are still with the workers; each
    episode samples from its own stream, so every episode plays the same turns, replies and outcome as without.
    The pool here hands its answers out one per poll, as workers that answer one by one would."""
    path, tok = tiny
    eng = HFEngine(path, tok)
    a, b = load_tasks("train")[:2]
    groups = [{**grp(a, 1, 2), "key": ("train", 0, 5, 0)}, {**grp(b, 0, 2), "key": ("train", 0, 5, 1)}]
    log = {"calls": [], "sent": 0, "got": 0, "submits_while_stepping": 0}

    class OneByOne:  # the real pool; its answers one per poll call
        def __init__(self):
            self.held = []

        def run(self, reqs):
            log["calls"].append("run")
            return pool.run(reqs)

        def send(self, reqs):
            log["calls"].append("send")
            log["sent"] += len(reqs)
            return pool.send(reqs)

        def poll(self, wait=False):
            self.held += pool.poll(wait and not self.held)
            log["got"] += bool(self.held)
            return [self.held.pop(0)] if self.held else []

    class Engine:  # the real engine; a submit while the workers hold steps is counted
        def generate(self, *a):
            log["calls"].append("generate")
            return eng.generate(*a)

        def submit(self, *a):
            log["calls"].append("submit")
            log["submits_while_stepping"] += log["sent"] > log["got"]
            return eng.submit(*a)

        def poll(self):
            return eng.poll()

    def play(overlap):
        log.update(calls=[], sent=0, got=0, submits_while_stepping=0)
        c = cfg(constrained=True, sample_streams="episode", max_steps=4, overlap=overlap)
        out = rollout(Engine(), OneByOne(), tok, groups, c)
        return [(e["played"], e["won"], e["steps"], e["invalid"],
                 [r["response_ids"] for r in out["rows"] if r["eid"] == e["eid"]]) for e in out["episodes"]], \
            dict(log), out["stats"]
    off, log_off, st_off = play(False)
    on, log_on, st_on = play(True)
    assert on == off and len(on) == 4 and sum(e[2] for e in on) > 4
    assert "generate" in log_off["calls"] and "submit" not in log_off["calls"] and "send" not in log_off["calls"]
    assert "generate" not in log_on["calls"] and log_on["submits_while_stepping"] > 0
    for k in ("env_steps", "gen_tokens", "prompts", "invalid", "prefix_steps", "rollouts"):
        assert st_on[k] == st_off[k], k

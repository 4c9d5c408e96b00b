"""Batched multi-turn agent rollouts, in the order they are built: the hint a prefix comes from, a rollout
group, prompts, replies and their reward (the reply rule), two engines (vLLM, HF generate) behind one
interface, the vLLM weight sync, and the rollout loop over the env pool.

    hints, reply = make_hints(cfg, tasks), Reply(cfg)   # at setup (hints: ExpertSource or a variant's)
    out = rollout(engine, pool, tok, [group(task, hints.hint(task), n, R)], cfg, seed, reply)
    out["rows"]      per-step training rows (prompt ids, response ids, engine log-probs, group / episode /
                     step, valid, reward; obs, action, milestone: for the advantage estimators)
    out["aux"]       one row per expert-prefix step: the prompt the policy would have seen + the expert reply
                     (with its think where the prompt asks for one), "n" = the prefix's length
    out["episodes"]  won, reward, steps, invalid, error, played (the prefix and the valid actions after it)
    out["stats"]     rollouts, env steps, generated tokens, gen/env/overhead seconds, truncations

Each turn, every live episode generates in one engine call (--overlap: each as its observation comes);
finished ones drop out. Prefix steps are in the history like the agent's own and count against max_steps.
"""
import contextlib
import functools
import itertools
import os
import random
import re
import time
from typing import NamedTuple

import torch

from envs import env_class
from grpo import FREE, pad_options, response_logprobs, token_logprobs, trie_options
from plumbing.parallel import kv_cache_gb
from plumbing.streams import RowStreams, stream_seed
from plumbing.trie_mask import allowed_arg, trie_mask_processor
from plumbing.vllm_log import quiet_vllm


# ----------------------------------------------------------------------------------------------
# Hints: where a replayed prefix (and a line of the prompt) comes from
# ----------------------------------------------------------------------------------------------
class Hint(NamedTuple):
    """A hint for a task: `actions` to replay the first n of (L = len(actions); none: played at depth 0),
    their `thinks` (the aux / SFT targets' reasoning; may be empty), a `text` for the prompt ("": none; else
    the line "Hint: <text>" after the task, in every episode of the task's group)."""
    actions: list
    thinks: list = []
    text: str = ""


class ExpertSource:
    """The paper's hint source: each task's expert trajectory (its walkthrough, or the authors' expert data
    that plumbing/expert_data.py put in its place, with its thinks); learns nothing. A hint source has
    hint(task) -> Hint | None (once per task per step: the scheduler's L and the prefix come from one answer;
    and at setup); observe(every rank's episodes of a step: {"task_id", "won", "error", "played"}) -> the task
    ids whose hint changed; state_dict() / load_state_dict(sd) (JSON, checkpointed). hint() reads only the
    task and the source's state, changed in observe() alone (every rank asks alike: a random source draws from
    its own seeded generator, in its state_dict). Others: variants/hints.py, --hint_source file:Class built as
    Class(cfg, tasks) (README "Hack it")."""

    def __init__(self, tasks):
        self.trajectories = {t["id"]: Hint(list(t["walkthrough"]), list(t.get("thinks") or []))
                             for t in tasks if t["walkthrough"]}

    def hint(self, task):
        return self.trajectories.get(task["id"])

    def observe(self, episodes):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def make_hints(cfg, tasks):
    """--hint_source expert, no --drop_walkthroughs: ExpertSource; else (self, mixed, expert less a dropped
    share, file:Class) Class(cfg, tasks), looked up once through config.variant (variants/hints.py)."""
    if cfg.hint_source == "expert" and not cfg.drop_walkthroughs:
        return ExpertSource(tasks)
    from config import variant
    return variant("hints", "dropped" if cfg.hint_source == "expert" else cfg.hint_source)(cfg, tasks)


def group(task, hint, n, R):
    """A rollout group: R episodes of `task` after the first n actions of its hint (None: n = 0), its text."""
    actions, thinks, text = hint or Hint([])
    if n > len(actions):
        raise ValueError(f"task {task['id']}: a prefix of {n} steps, but its hint has {len(actions)}")
    return {"task": task, "n": n, "R": R, "prefix": list(actions[:n]), "thinks": list(thinks[:n]),
            "text": text}




# ----------------------------------------------------------------------------------------------
# Prompt protocol (docs/method.md §7) and parsing
# ----------------------------------------------------------------------------------------------
def user_message(task, room, history, obs, admissible, step, cfg, hint=""):
    """The single-turn user message for one decision. history: [(obs, action)], prefix steps included. hint: a
    hint's text, shown on a line of its own after the task ("": no line, the prompt as without hints)."""
    if cfg.prompt == "compact":  # tiny-model variant: every past action, short observation, action tag only
        done = " | ".join(a for _, a in history) or "-"
        obs = obs.replace(" [SEP] ", " | ")  # WebShop pages: shorter separators (ALFWorld text has none)
        msg = (f"task: {task}\n" + (f"hint: {hint}\n" if hint else "") + (f"room: {room}\n" if room else "")
               + f"done: {done}\nnow: {obs}")
        if not cfg.constrained:  # under constrained decoding the decoder already knows the options
            msg += f"\noptions: {' | '.join(admissible)}\nreply: <action> one option </action>"
        return msg
    past = history[-cfg.history_length:] if cfg.history_length > 0 else []
    who, tip = env_class(cfg.env).wording  # the agent's wording comes with the environment (envs.ENVS)
    lines = [f"You are {who}. Your task is to: {task}", *([f"Hint: {hint}"] if hint else []),
             f"You have already taken {step} step(s)."]
    if past:
        lines.append(f"Your most recent {len(past)} observation(s) and action(s):")
        for i, (o, a) in enumerate(past, start=step - len(past) + 1):
            lines += [f"[Observation {i}] {o}", f"[Action {i}] {a}"]
    lines += [f"Current observation: {obs}", "The actions you can take now: " + ", ".join(admissible),
              "First reason briefly inside <think> </think>, then reply with exactly one of the actions "
              "inside <action> </action>." + (f" {tip}" if tip else "")]
    return "\n".join(lines)


def expert_reply(action, think=None):
    """An expert action as a policy reply (aux and SFT targets): the action tag alone, or (think not None: the
    full prompt) "<think>{think}</think>\n<action>{action}</action>" as the authors render prefix-SFT targets
    [ZJU-REAL/Agent-G2 agent_system/multi_turn_rollout/rollout_loop.py, _build_prefix_sft_batch]."""
    if think is None:
        return f"<action>{action}</action>"
    return f"<think>{think}</think>\n<action>{action}</action>"


def target_think(thinks, t, cfg):
    """The think of expert step t in its target: None (no think tag) under the compact prompt or constrained
    decoding (the decoder allows action tags only); else the hint's think, "" when it has none."""
    if cfg.prompt != "full" or cfg.constrained:
        return None
    return thinks[t] if t < len(thinks) else ""


def chat_ids(tok, message):
    """The chat template around one user message, tokenised, with the assistant's turn opened."""
    return chat_ids_batch(tok, [message])[0]


def chat_ids_batch(tok, messages):
    """chat_ids of several messages, the batch encoded at once (the same ids as one at a time)."""
    chats = [[{"role": "user", "content": m}] for m in messages]
    ids = chats and tok.apply_chat_template(chats, add_generation_prompt=True, return_dict=False)
    return [list(x) for x in (ids["input_ids"] if isinstance(ids, dict) else ids)]


def fit_prompt(tok, task, room, history, obs, admissible, step, cfg, hint=""):
    """The prompt of one decision within --max_prompt_tokens -> (ids, truncated?). An over-long one drops past
    steps, oldest first; the task line (and a hint's line) and the current observation stay; with no history
    left, the middle goes (the first quarter of the budget stays, the rest from the end). (The authors
    truncate from the left, which drops the task first: data.truncation=left.)"""
    first = max(0, len(history) - cfg.history_length) if cfg.prompt == "full" else 0  # the first step shown
    for j in range(first, len(history) + 1):
        ids = chat_ids(tok, user_message(task, room, history[j:], obs, admissible, step, cfg, hint))
        if len(ids) <= cfg.max_prompt_tokens:
            return ids, j > first
    head = cfg.max_prompt_tokens // 4
    return ids[:head] + ids[len(ids) - (cfg.max_prompt_tokens - head):], True


def fit_prompts(tok, turns, cfg):
    """fit_prompt for a turn, turns: [(task, room, history, obs, admissible, step, hint)]; the prompts in one
    batch, one over --max_prompt_tokens through fit_prompt's loop. -> [(ids, truncated?)]"""
    first = [max(0, len(t[2]) - cfg.history_length) if cfg.prompt == "full" else 0 for t in turns]
    whole = chat_ids_batch(tok, [user_message(task, room, history[j:], obs, adm, step, cfg, hint)
                                 for j, (task, room, history, obs, adm, step, hint) in zip(first, turns)])
    return [(ids, False) if len(ids) <= cfg.max_prompt_tokens else fit_prompt(tok, *t[:6], cfg, t[6])
            for ids, t in zip(whole, turns)]


def parse_action(text, finished=True):
    """The text between the first <action> and the next </action>, stripped; None if missing, empty, or the
    reply ran out of tokens (over-long)."""
    if not finished or not isinstance(text, str):
        return None
    i = text.find("<action>")
    j = text.find("</action>", i + 8) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return " ".join(text[i + 8:j].split()) or None


CJK = re.compile(r"[\u4e00-\u9fff]")


class Reply:
    """The reply rule, built once at setup (rollout's loop reads no flag): read(text, finished) -> (action or
    None, valid?); reward(won, n_invalid); row_rewards(won, invalid: a bool per row) -> a reward per row;
    adv_level "traj" (grpo.row_advantages from episode rewards) | "step". Defaults (CPU presets):
    parse_action, the 0/1 outcome. --preset paper reads as the authors' projection does
    [agent_system/environments/env_package/webshop/projection.py, verl-agent's alfworld_projection]:
    --parse_lower reads the lower-cased reply; --parse_think makes one without <think>...</think>, or with a
    CJK character, invalid (still played). reward = --reward_scale * won - --invalid_penalty * invalid steps,
    on every row (traj) or won minus the row's own penalty (step, the released code's: verl-agent's)."""

    def __init__(self, cfg):
        self.lower, self.think = cfg.parse_lower, cfg.parse_think
        self.scale, self.penalty, self.adv_level = cfg.reward_scale, cfg.invalid_penalty, cfg.adv_level

    def read(self, text, finished):
        text = text.lower() if self.lower and isinstance(text, str) else text
        action = parse_action(text, finished)
        ok = action is not None
        if ok and self.think:
            ok = "<think>" in text and "</think>" in text and not CJK.search(text)
        return action, ok

    def reward(self, won, n_invalid):
        return self.scale * float(won) - self.penalty * n_invalid

    def row_rewards(self, won, invalid):
        if self.adv_level == "traj":
            return [self.reward(won, sum(invalid))] * len(invalid)
        return [self.reward(won, float(b)) for b in invalid]  # [released] won minus this row's own penalty


# ----------------------------------------------------------------------------------------------
# Engines: generate(prompts, max_new_tokens, temperature, seed, allowed) -> [{"ids", "logprobs", "finished"}]
#          allowed: per prompt, the token sequences of every admissible reply (choice_ids),
#                   or None (free text)
#          submit(same arguments) -> handles; poll() -> [(handle, reply)] of the requests finished by then
#          (--overlap: replies go to the env workers as they finish, prompts join the running engine)
#          load_weights(named_tensors)
# ----------------------------------------------------------------------------------------------
def _free_head():
    from plumbing.webshop import SEARCH_ACTION
    return "<action>" + SEARCH_ACTION.split("<")[0]  # '<action>search['


def choice_ids(tok, commands):
    """Token sequences of every allowed reply (constrained decoding). A command with a free-text slot
    (WebShop's 'search[<query>]') allows its literal start, then anything (grpo.FREE): the query is the
    policy's own text. Each command is tokenised once per tokenizer (_choice: a turn asks again for most)."""
    return [list(_choice(tok, c)) for c in commands]


@functools.lru_cache(65536)
def _choice(tok, command):
    from plumbing.webshop import SEARCH_ACTION
    if command == SEARCH_ACTION:
        return tuple(tok.encode(_free_head(), add_special_tokens=False)) + (FREE,)
    return tuple(tok.encode(expert_reply(command), add_special_tokens=False)) + (tok.eos_token_id,)


def expert_ids(tok, action, think=None):
    """An expert action as reply ids + EOS (aux and SFT targets), along a path the constrained decoder
    allows: a search's literal start encoded alone, as in choice_ids (a tokenizer may merge '[' with the
    query). think: as expert_reply."""
    reply, head = expert_reply(action, think), _free_head()
    if reply.startswith(head):
        return (tok.encode(head, add_special_tokens=False)
                + tok.encode(reply[len(head):], add_special_tokens=False) + [tok.eos_token_id])
    return tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]


def seed63(seed):
    """A derived sampling seed, reduced into [0, 2^63): vLLM V2 keeps request seeds in an int64 array and
    torch.manual_seed refuses values past 2^64, and seed * 100003 + i passes 2^63 once --seed is above
    ~92,000."""
    return seed % 2**63


class HFEngine:
    """transformers `generate`, for machines without vLLM. Log-probs are of the distribution that was sampled:
    restricted to the admissible-reply trie when `allowed` is given, at the sampling temperature (1 for
    greedy)."""

    def __init__(self, model_path, tok, device="cpu", dtype=torch.float32):
        from transformers import AutoModelForCausalLM
        self.tok, self.device = tok, device
        from transformers import GenerationConfig
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        # generate() fills every field we leave unset from the model's generation_config (transformers
        # generation/utils.py, _prepare_generation_config), e.g. Qwen2.5-Instruct's repetition_penalty 1.05,
        # top_k 20, top_p 0.8: the replies would not come from the distribution whose log-probs the trainer
        # scores. A blank config leaves only transformers' neutral defaults; generate() sets sampling, top_k 0
        # and top_p 1 itself.
        self.model.generation_config = GenerationConfig()
        self.vocab = list(range(self.model.config.vocab_size))  # a free-text slot allows every token
        self.tensors = self.model.state_dict(keep_vars=True)  # name -> the live tensor (tied names share one)
        self.queue, self.handles = [], itertools.count()  # submit's requests not generated yet, their ids

    def load_weights(self, named_tensors):
        """Copy (name, tensor) pairs in one at a time as they come, as the vLLM sync does: under FSDP each is
        gathered for this copy alone, so no rank holds a second full model. Every tensor must come
        (strict)."""
        seen = set()
        with torch.no_grad():
            for name, t in named_tensors:
                self.tensors[name].copy_(t)
                seen.add(name)
        if seen != set(self.tensors):
            raise KeyError(f"weight sync: no tensor for {sorted(set(self.tensors) - seen)[:3]}")

    def sleep_mode(self, on):  # nothing to free: the HF engine has no KV cache between calls
        pass

    def submit(self, prompts, *args):  # --overlap: generate's arguments; generated at the next poll
        self.queue.append(([next(self.handles) for _ in prompts], (prompts, *args)))
        return self.queue[-1][0]

    def poll(self):  # what was submitted since the last poll, a generate call per submit -> [(handle, reply)]
        queue, self.queue = self.queue, []
        return [(h, o) for handles, args in queue for h, o in zip(handles, self.generate(*args))]

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        pad, eos, out = self.tok.pad_token_id, self.tok.eos_token_id, []
        bs = 64
        for b0 in range(0, len(prompts), bs):
            chunk = prompts[b0:b0 + bs]
            P = max(len(p) for p in chunk)
            x = torch.tensor([[pad] * (P - len(p)) + p for p in chunk], device=self.device)
            att = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in chunk], device=self.device)
            kw = {}
            if allowed is not None:
                tries = allowed[b0:b0 + bs]

                def prefix_fn(b, ids, tries=tries):
                    nxt = trie_options(ids[P:].tolist() + [-1], tries[b])[-1]
                    return self.vocab if nxt is None else nxt or [eos]
                kw["prefix_allowed_tokens_fn"] = prefix_fn
            if isinstance(seed, list):  # a stream per request: Gumbel-max on its own noise, decoded greedily
                streams = [RowStreams(seed[b0:b0 + bs], P, temperature)] if temperature > 0 else []
                kw["logits_processor"] = streams
                kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
            else:
                torch.manual_seed(seed63(seed + b0))
                kw.update(do_sample=temperature > 0, temperature=max(temperature, 1e-5), top_k=0, top_p=1.0)
            g = self.model.generate(input_ids=x, attention_mask=att, max_new_tokens=max_new_tokens,
                                    pad_token_id=pad, eos_token_id=eos, output_logits=True,
                                    return_dict_in_generate=True, **kw)
            seq = g.sequences[:, P:]  # [b, T]
            n = [s.index(eos) + 1 if eos in s else len(s) for s in seq.tolist()]
            opts = pad_options([trie_options(seq[i, :n[i]].tolist(), tries[i])
                                if allowed is not None else None
                                for i in range(len(chunk))], seq.shape[1], self.device)
            # the distribution that was sampled: raw logits, restricted to the trie, at the temperature
            lp = token_logprobs(torch.stack(g.logits, 1), seq, opts, temperature)  # [b, T]
            for i in range(len(chunk)):
                ids = seq[i, :n[i]].tolist()
                out.append({"ids": ids, "logprobs": lp[i, :n[i]].tolist(), "finished": eos in ids})
        return out


def sync_check(engine, model, row, pad_id, device, cfg, seed=0, ctx=contextlib.nullcontext):
    """After a weight sync: the engine's greedy reply to `row`'s prompt (under the row's constraint, if any),
    scored by `model` the way the trainer scores rows. -> max |log-prob difference| (when the sync landed:
    ~1e-6 in fp32, ~1e-2 with bf16 on either side; docs/update.md)."""
    allowed = [row["allowed"]] if "allowed" in row else None
    o = engine.generate([row["prompt_ids"]], cfg.max_new_tokens, 0.0, seed, allowed)[0]
    chk = {"prompt_ids": row["prompt_ids"], "response_ids": o["ids"],
           **({"allowed": row["allowed"]} if allowed else {})}
    with torch.no_grad(), ctx():  # ctx: the trainer's precision (bf16 autocast), around the scoring only
        lp = response_logprobs(model, [chk], pad_id, device, 1.0)[0][0].cpu()
    return (lp - torch.tensor(o["logprobs"])).abs().max().item()


def sync_weights(llm, named_tensors):
    """The one place that touches vLLM's weight-loading internals (vLLM 0.32): a layerwise reload through
    collective_rpc (the iterator consumed lazily, in-process), then drop the prefix cache (KV of the old
    weights). The older model_runner.model.load_weights path corrupts the CPU backend's repacked weights."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
    llm.reset_prefix_cache()


class VLLMEngine:
    """One vllm.LLM per rank. Under torchrun it uses the external launcher (one engine per rank, in-process);
    alone, in-process engine core (so weight tensors can be passed directly). Log-probs are vLLM's processed
    ones: after the trie mask (TrieMask) and the temperature, i.e. of the distribution that was sampled."""

    def __init__(self, model_path, tok, seed=0, dtype="auto", max_model_len=4096, gpu_mem=0.5, sleep=False,
                 constrained=True, kv_gb=0.0, quiet=True, streams=False, block=0):
        import torch.distributed as dist
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if quiet:
            quiet_vllm()
        kw, env = engine_kwargs(model_path, dtype, seed, max_model_len, gpu_mem, kv_gb, sleep, constrained,
                                torch.cuda.is_available(), dist.is_available() and dist.is_initialized(),
                                streams, block)
        for k, v in env.items():
            if os.environ.get(k) != v and torch.cuda.is_available():  # CPU runs V1 anyway: nothing to say
                print(f"[vllm] {k}={v}: the trie mask of --constrained 1 is a V1-runner logits processor; "
                      "vLLM's V2 model runner (the CUDA default) accepts only its own interface")
            os.environ[k] = v
        from vllm import LLM
        self.llm, self.tok, self.sleep, self.constrained, self.cuda = LLM(**kw, use_tqdm_on_load=not quiet), \
            tok, kw["enable_sleep_mode"], constrained, torch.cuda.is_available()
        self.requests = itertools.count()  # submit's request ids

    def load_weights(self, named_tensors):
        sync_weights(self.llm, named_tensors)

    def params(self, n, max_new_tokens, temperature, seed, allowed):  # one SamplingParams per request
        from vllm import SamplingParams
        params = []
        for i in range(n):
            # a stream per request (--sample_streams episode); else from the call's seed on CUDA, the engine's
            rs = seed[i] if isinstance(seed, list) else seed63(seed * 100003 + i) if self.cuda else None
            if allowed is not None and not self.constrained:
                raise ValueError("this vLLM engine was built without the trie mask (constrained=False)")
            params.append(SamplingParams(n=1, temperature=temperature, top_p=1.0,
                                         top_k=0 if temperature > 0 else -1,
                                         max_tokens=max_new_tokens, logprobs=0, seed=rs,
                                         extra_args=None if allowed is None
                                         else {"allowed": allowed_arg(allowed[i])}))
        return params

    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        params = self.params(len(prompts), max_new_tokens, temperature, seed, allowed)
        res = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [vllm_reply(r.outputs[0]) for r in res]

    def submit(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        """Requests into the running engine (--overlap) -> their handles, for poll. As LLM.generate adds them
        (vllm/entrypoints/common/offline.py: _preprocess_cmpl renders, _add_request asks for the final output
        only), under ids of our own (add_request returns vLLM's, ours plus a suffix; outputs carry ours)."""
        from vllm.sampling_params import RequestOutputKind
        handles = [f"g2-{next(self.requests)}" for _ in prompts]
        for h, p, sp in zip(handles, self.llm._preprocess_cmpl([{"prompt_token_ids": p} for p in prompts]),
                            self.params(len(prompts), max_new_tokens, temperature, seed, allowed)):
            sp.output_kind = RequestOutputKind.FINAL_ONLY
            self.llm.llm_engine.add_request(h, p, sp)
        return handles

    def poll(self):  # one engine step (as LLM.generate's loop, offline.py _run_engine) -> [(handle, reply)]
        return [(r.request_id, vllm_reply(r.outputs[0])) for r in self.llm.llm_engine.step() if r.finished]

    def sleep_mode(self, on):
        if not self.sleep:
            return
        if on:  # level 2 drops the weights (the sync rewrites them all) and the KV cache; vLLM keeps the
            # buffers (rotary tables) on the host and restores them at wake_up (vllm/v1/worker/gpu_worker.py,
            # sleep). Level 1 would copy the weights to pinned host RAM every step: 14 GB a rank at 7B.
            self.llm.sleep(level=2)
        else:
            torch.cuda.empty_cache()  # the trainer's freed blocks back to the driver, where vLLM allocates
            self.llm.wake_up()


def vllm_reply(c):  # a vLLM CompletionOutput -> {"ids", "logprobs" (of the sampled tokens), "finished"}
    ids = list(c.token_ids)
    return {"ids": ids, "logprobs": [d[t].logprob for d, t in zip(c.logprobs, ids)],
            "finished": c.finish_reason == "stop"}


def engine_kwargs(model_path, dtype, seed, max_model_len, gpu_mem, kv_gb,
                  sleep, constrained, cuda, distributed, streams=False, block=0):
    """The arguments of vllm.LLM (vLLM 0.32) and the environment it needs. -> (kwargs, env vars to set).
    - logits_processors only with --constrained 1, and then the V1 model runner: on CUDA vLLM 0.32 defaults to
      its V2 runner when Triton is present (vllm/config/vllm.py, VllmConfig.use_v2_model_runner), and V2
      rejects any processor that does not subclass its own LogitsProcessor
      (vllm/v1/worker/gpu/sample/logits_processor/loader.py). The CPU backend has no Triton and
      always runs V1.
    - kv_gb > 0: a KV cache of exactly that size (kv_cache_memory_bytes, which overrides
      gpu_memory_utilization), so the engine takes what the rollouts need instead of a share of the card;
      kv_gb <= 0: vLLM sizes it from gpu_memory_utilization.
    - block > 0: the KV cache's block_size, else vLLM's (prefix caching reuses a prompt by whole blocks)."""
    kw = dict(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
              enable_prefix_caching=True, enforce_eager=not cuda, enable_sleep_mode=bool(sleep and cuda),
              logprobs_mode="processed_logprobs")
    env = {}
    if constrained:
        kw["logits_processors"] = [trie_mask_processor()]
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if cuda:
        kw["gpu_memory_utilization"] = gpu_mem
        if kv_gb > 0:
            kw["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
    if distributed:
        kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    if block:
        kw["block_size"] = block
    if streams and not cuda:  # per-request seeds: vLLM-CPU fails on a seeded request whose prefill is chunked
        kw["enable_chunked_prefill"] = False
    return kw, env


def make_engine(cfg, model_path, tok, device, seed, seqs=1):
    """--engine auto|vllm|hf. auto = vLLM when it imports. seqs: the most sequences a rank plays at once (the
    KV cache is sized for them when --vllm_kv_gb is 0)."""
    name = cfg.engine
    if cfg.vllm_log == "quiet":  # before vLLM's first import: some notices come with it
        quiet_vllm()
    if name == "auto":
        try:
            import vllm  # noqa: F401
            name = "vllm"
        except Exception:
            name = "hf"
    if name == "vllm":
        max_len = cfg.max_prompt_tokens + cfg.max_new_tokens
        if os.path.isdir(model_path):  # a clear error before vLLM's own (a hub id is checked by vLLM)
            from transformers import AutoConfig
            ctx = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
            if ctx and max_len > ctx:
                raise SystemExit(f"error: --max_prompt_tokens {cfg.max_prompt_tokens} + --max_new_tokens "
                                 f"{cfg.max_new_tokens} = {max_len} exceeds {model_path}'s context of "
                                 f"{ctx} tokens")
        kv = cfg.vllm_kv_gb or (kv_cache_gb(model_path, seqs, max_len) if device != "cpu" else 0.0)
        return VLLMEngine(model_path, tok, seed, "float32" if device == "cpu" else "bfloat16", max_len,
                          cfg.vllm_mem, cfg.vllm_sleep, cfg.constrained, kv, cfg.vllm_log == "quiet",
                          cfg.sample_streams == "episode", cfg.vllm_block)
    return HFEngine(model_path, tok, device, torch.float32 if device == "cpu" else torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# The rollout loop
# ----------------------------------------------------------------------------------------------
episode_ids = itertools.count(1)  # one id per episode this process plays: the env workers' handle


def rollout(engine, pool, tok, groups, cfg, seed=0, reply=None):
    """Run every group's R episodes to the end. groups: [{"task", "n": prefix length, "R", "prefix": the n
    hint actions to replay, "thinks": theirs (may be empty), "text": the hint's text for the prompt (may be
    absent)}] (group builds one). reply: the reply rule built at setup (None: Reply(cfg))."""
    reply = Reply(cfg) if reply is None else reply
    st = dict(rollouts=0, env_steps=0, gen_tokens=0, t_gen=0.0, t_env=0.0, prompts=0, truncated=0, invalid=0,
              errors=0, prefix_steps=0)
    t_start = time.time()
    eps, streams = [], cfg.sample_streams == "episode" and all(g.get("key") for g in groups)  # else engine's
    for gid, g in enumerate(groups):
        for r in range(g["R"]):
            eps.append({"eid": next(episode_ids), "gid": gid, "task": g["task"], "n": g["n"], "rows": [],
                        "done": False, "won": False, "invalid": 0, "error": None,
                        "thinks": g.get("thinks") or [], "text": g.get("text") or "",
                        "key": (*g["key"], r) if streams else None,  # its sampling stream, with the turn
                        "played": list(g["prefix"])})  # played: the prefix, then the valid actions taken

    def timed(key, f, *a):  # f(*a), its seconds added to st[key]
        t0 = time.time()
        out = f(*a)
        st[key] += time.time() - t0
        return out
    res = timed("t_env", pool.run, [("reset", e["eid"], e["task"]["gamefile"], e["played"]) for e in eps])
    aux, aux_done = [], set()
    for e, r in zip(eps, res):
        st["rollouts"] += 1
        if not r["ok"]:
            e.update(done=True, error=r["error"])
            st["errors"] += 1
            continue
        e.update(obs=r["obs"], admissible=r["admissible"], history=list(map(tuple, r["history"])),
                 won=r["won"], goal=r["task"], room=r["room_short" if cfg.prompt == "compact" else "room"],
                 score=r.get("score", float(r["won"])))
        e["steps"] = len(e["history"])  # prefix steps count against max_steps
        st["prefix_steps"] += e["steps"]
        if e["gid"] not in aux_done:  # the prefix is shared by the group's R rollouts: one set of aux rows
            aux_done.add(e["gid"])
            for t, (o, adm, a) in enumerate(r["prefix_steps"]):
                ids, _ = fit_prompt(tok, e["goal"], e["room"], e["history"][:t], o, adm, t, cfg, e["text"])
                aux.append({"prompt_ids": ids,  # allowed: scored as constrained play samples (method §2.2)
                            "response_ids": expert_ids(tok, a, target_think(e["thinks"], t, cfg)),
                            "gid": e["gid"], "t": t, "n": len(r["prefix_steps"]),
                            **({"allowed": choice_ids(tok, adm)} if cfg.constrained else {})})
        e["done"] = e["won"] or e["steps"] >= cfg.max_steps

    def prompts_for(live, turn):  # the live episodes' prompts -> (prompts, allowed or None, sampling seeds)
        fitted = fit_prompts(tok, [(e["goal"], e["room"], e["history"], e["obs"], e["admissible"], e["steps"],
                                    e["text"]) for e in live], cfg)
        st["truncated"] += sum(tr for _, tr in fitted)
        st["prompts"] += len(live)
        allowed = [choice_ids(tok, e["admissible"]) for e in live] if cfg.constrained else None
        seeds = [stream_seed(*e["key"], e["steps"]) for e in live] if streams else seed * 1000 + turn
        return [ids for ids, _ in fitted], allowed, seeds

    def take(e, p, allowed, o):  # an episode's reply -> its training row; -> its env request
        st["gen_tokens"] += len(o["ids"])
        text = tok.decode(o["ids"], skip_special_tokens=True)
        action, ok = reply.read(text, o["finished"])
        e["rows"].append({"prompt_ids": p, "response_ids": o["ids"], "logprobs": o["logprobs"],
                          "gid": e["gid"], "eid": e["eid"], "t": e["steps"], "valid": ok, "text": text,
                          "obs": e["obs"], "action": action or "",  # the raw observation acted on, the action
                          **({"allowed": allowed} if allowed is not None else {})})
        return ("step", e["eid"], action or "")

    def settle(e, req, r):  # the worker's answer to an episode's step
        e["steps"] += 1
        st["env_steps"] += 1
        if not r["ok"]:
            e.update(done=True, won=False, error=r["error"])
            st["errors"] += 1
            return
        row = e["rows"][-1]
        row["valid"] = row["valid"] and r["valid"]
        row["milestone"] = r.get("milestone", False)  # a WebShop milestone reached by this step (BEACON)
        if r["valid"]:  # the environment took it (a format-invalid reply may still have been played)
            e["played"].append(req[2])
        e["invalid"] += not row["valid"]
        st["invalid"] += not row["valid"]
        e["history"].append((e["obs"], req[2]))
        e.update(obs=r["obs"], admissible=r["admissible"], won=r["won"], score=r["score"])
        e["done"] = e["won"] or r["done"] or e["steps"] >= cfg.max_steps

    if not (streams and cfg.overlap):  # the turns: every live episode's reply in one batch, then their steps
        turn, live = 0, [e for e in eps if not e["done"]]
        while live:
            prompts, allowed, seeds = prompts_for(live, turn)
            outs = timed("t_gen", engine.generate, prompts, cfg.max_new_tokens, cfg.temperature, seeds,
                         allowed)
            reqs = [take(e, p, allowed and allowed[j], o)
                    for j, (e, p, o) in enumerate(zip(live, prompts, outs))]
            for e, req, r in zip(live, reqs, timed("t_env", pool.run, reqs)):
                settle(e, req, r)
            turn, live = turn + 1, [e for e in live if not e["done"]]
    else:  # --overlap: each reply goes to the workers as the engine finishes it, each next prompt joins the
        # running engine as its observation comes back (each episode samples from its own stream, so what
        # shares an engine step changes no sample); t_env: the time the engine waited for the workers
        asked, ready, stepping, by_eid = {}, [e for e in eps if not e["done"]], 0, {e["eid"]: e for e in eps}
        while ready or asked or stepping:
            if ready:
                prompts, allowed, seeds = prompts_for(ready, 0)
                handles = engine.submit(prompts, cfg.max_new_tokens, cfg.temperature, seeds, allowed)
                asked.update({h: (e, p, allowed and allowed[j])
                              for j, (h, e, p) in enumerate(zip(handles, ready, prompts))})
                ready = []
            if asked:
                reqs = [take(*asked.pop(h), o) for h, o in timed("t_gen", engine.poll)]
                pool.send(reqs)
                stepping += len(reqs)
            answers = timed("t_env", pool.poll, not asked)  # wait for the workers only when idle
            for req, r in answers:
                settle(by_eid[req[1]], req, r)
            stepping -= len(answers)
            ready = [by_eid[req[1]] for req, _ in answers if not by_eid[req[1]]["done"]]
    pool.run([("close", e["eid"]) for e in eps])
    episodes, rows = [], []
    for e in eps:
        episodes.append({"eid": e["eid"], "gid": e["gid"], "task_id": e["task"]["id"], "n": e["n"],
                         "played": e["played"], "won": bool(e["won"]),
                         "reward": reply.reward(e["won"], e["invalid"]), "steps": e.get("steps", 0),
                         "score": float(e.get("score", 0.0)) if not e["error"] else 0.0,
                         "invalid": e["invalid"], "error": e["error"]})
        for r, rr in zip(e["rows"], reply.row_rewards(e["won"], [not x["valid"] for x in e["rows"]])):
            r["reward"] = rr  # traj: the episode's reward; step (released): won minus this step's own penalty
            rows.append(r)
    flags = group_successes({"episodes": episodes}, len(groups))  # per group: kept 0/1 outcomes
    for a in aux:  # its group's success rate (None: every episode lost to an error), for a term that reads it
        a["success"] = sum(flags[a["gid"]]) / len(flags[a["gid"]]) if flags[a["gid"]] else None
    st["t_total"] = time.time() - t_start
    st["t_overhead"] = st["t_total"] - st["t_gen"] - st["t_env"]
    return {"rows": rows, "aux": aux, "episodes": episodes, "stats": st}


def group_successes(out, n_groups):
    """Per group: list of 0/1 won flags, in episode order (error episodes left out)."""
    flags = [[] for _ in range(n_groups)]
    for e in out["episodes"]:
        if not e["error"]:  # an episode lost to an engine error says nothing about the task's difficulty
            flags[e["gid"]].append(int(e["won"]))
    return flags


def seed_all(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    import numpy as np
    np.random.seed(seed % 2**32)


# ----------------------------------------------------------------------------------------------
# The player: who plays a step's groups (the probe and SFT baselines' players: variants/players.py)
# ----------------------------------------------------------------------------------------------
class Player:
    """The paper's player: this rank's R rollouts per task after each task's n-step hint prefix, in one batch
    (rollout). plays: the policy plays episodes (the SFT baselines' player does not); stats: the rollouts a
    probe rule spent before the depths were fixed (none here)."""
    plays = True

    def __init__(self, engine, pool, tok, cfg, reply=None, rank=0, gather=lambda x: [x]):
        self.engine, self.pool, self.tok, self.cfg, self.reply = engine, pool, tok, cfg, reply
        self.rank, self.gather, self.stats = rank, gather, {}

    def prober(self, step, tasks, hints, mine):  # the probe rules' callback: none on the paper's path
        return None

    def play(self, step, tasks, hints, n, pos):  # this rank's tasks, hints, depths, places in the batch
        groups = [{**group(t, h, ni, self.cfg.group_size), "key": ("train", self.cfg.seed, step, p)}
                  for t, h, ni, p in zip(tasks, hints, n, pos)]
        return rollout(self.engine, self.pool, self.tok, groups, self.cfg,
                       self.cfg.seed * 1_000_003 + step * 1009 + self.rank, self.reply)


def make_player(cfg, rule, engine, pool, tok, reply=None, rank=0, gather=lambda x: [x]):
    """The paper's Player, or (an SFT mode, a rule that probes) its player in variants/players.py, looked up
    once through config.variant."""
    kind = ("sft" if cfg.mode in ("sft_full", "sft_prefix") else
            "probe" if getattr(rule, "probes", False) else None)
    if kind is None:
        return Player(engine, pool, tok, cfg, reply, rank, gather)
    from config import variant
    return variant("players", kind)(engine, pool, tok, cfg, reply, rank, gather)


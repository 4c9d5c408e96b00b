"""The rollout engines behind one interface, and the weight sync: vLLM (CUDA or its CPU build), or
transformers' generate where vLLM is missing. Machinery: trust it unread (tests/test_rollout.py checks each
promise on the tiny model: log-probs against transformers' and the trainer's, the sync, the streams).

Contract. make_engine(cfg, model_path, tok, device, seed, seqs) -> an engine with
    generate(prompts, max_new_tokens, temperature, seed, allowed) -> [{"ids", "logprobs", "finished"}]
        prompts: token-id lists; seed: one int for the call or one per prompt (each episode's stream);
        allowed: per prompt the token sequences of every admissible reply (rollout.choice_ids), or None;
        promises: "logprobs" are of the distribution that was sampled (after the trie restriction, at the
        temperature; greedy: T = 1), one per generated token; the same seed gives the same reply;
    submit(same arguments) -> handles; poll() -> [(handle, reply)] finished by then (--overlap);
    load_weights(named_tensors): every tensor of the policy, streamed one at a time; after it the engine
        samples from those weights (sync_check measures it on a row: ~1e-6 in fp32);
    sleep_mode(on): free / take back the engine's memory around the update (--vllm_sleep; a no-op on CPU).
"""
import contextlib
import itertools
import os

import torch

from grpo import pad_options, response_logprobs, token_logprobs, trie_options
from plumbing.parallel import kv_cache_gb
from plumbing.streams import RowStreams
from plumbing.trie_mask import allowed_arg, trie_mask_processor
from plumbing.vllm_log import quiet_vllm


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

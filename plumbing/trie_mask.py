"""The vLLM side of constrained decoding (--constrained, the CPU presets' lever): each request's admissible
replies travel in SamplingParams.extra_args as one JSON string, and a v1 logits processor lets a request
continue only along their token trie, as HFEngine's prefix function does (rollout.VLLMEngine uses it).

    SamplingParams(..., extra_args={"allowed": allowed_arg(choice_ids(tok, commands))})
    LLM(..., logits_processors=[trie_mask_processor()])
"""
import functools
import json

import torch

from grpo import build_trie, trie_options


def allowed_arg(allowed):
    """One request's admissible replies (token sequences) as SamplingParams.extra_args carries them: a JSON
    string. vLLM deep-copies every request's SamplingParams and walks each list in extra_args to check its
    integers (vllm/sampling_params.py: clone, _verify_extra_args); one string costs neither."""
    return json.dumps(allowed, separators=(",", ":"))


@functools.lru_cache(4096)
def allowed_trie(arg):
    """allowed_arg's string -> grpo.build_trie's trie, built once per distinct admissible set (the R episodes
    of a group often share one). Read only."""
    return build_trie(json.loads(arg))


def trie_mask_processor():
    """The vLLM side of constrained decoding (vLLM 0.32's v1 logits-processor interface): a request whose
    SamplingParams.extra_args carry "allowed" (token sequences of the admissible replies) may only continue
    along that token trie, exactly like HFEngine's prefix function. Ours rather than structured outputs,
    because a grammar accepts any tokenization of a choice and appends an EOS without a log-prob; the trainer
    scores token tries."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class TrieMask(AdapterLogitsProcessor):
        def is_argmax_invariant(self):
            return False  # it changes the greedy choice too

        def new_req_logits_processor(self, params):
            allowed = (params.extra_args or {}).get("allowed")
            if not allowed:
                return None
            root = allowed_trie(allowed) if isinstance(allowed, str) else build_trie(allowed)

            def mask(output_ids, logits):  # logits [V] of one request
                keep = trie_options(list(output_ids) + [-1], root)[-1]
                if keep is None:  # inside a free-text slot
                    return logits
                out = torch.full_like(logits, float("-inf"))
                if keep:
                    idx = torch.tensor(keep, device=logits.device)
                    out[idx] = logits[idx]
                return out
            return mask
    return TrieMask

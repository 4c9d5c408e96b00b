"""Offline tiny model: a byte-level BPE tokenizer trained on ALFWorld's own text and a tiny
Qwen2-architecture causal LM, both saved in Hugging Face format. No network, seeded, deterministic.

    python -m plumbing.tiny [--out DIR] [--seed 0]      # builds (or finds) it and prints the path

Any code path that takes `--model` accepts the resulting directory exactly like a hub id:
AutoTokenizer / AutoModelForCausalLM / vllm.LLM all load it. head_dim = 32, the smallest that vLLM's
CPU attention backend accepts.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import tempfile

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<action>", "</action>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# max_position_embeddings 8192: the GPU presets' 4,096 + 512 token budgets fit (RoPE: no weights depend on it)
ARCH = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=384, max_position_embeddings=8192, rope_theta=10000.0, tie_word_embeddings=True)
VOCAB = 2048
# The prompt wording of rollout.user_message (both prompt forms), for the tokenizer to learn its words. It is
# BPE training text: a change here changes the tokenizer, so bump VERSION with it
PROMPT_TEXT = (
    "You are a household robot in a text world. Your task is to: "
    "You have already taken steps. Your most recent observations and actions: Observation: Action: "
    "Current observation: The actions you can take now: "
    "First reason briefly inside <think> </think>, then reply with exactly one of the actions inside "
    "<action> </action>. task: room: done: now: options:")

VERSION = 3  # bump when the recipe changes, so caches rebuild


def env_corpus():
    """Text the tokenizer learns from: ALFWorld's own grammar (every observation template), its object and
    receptacle names, the command verbs, numbers, and the prompt wording of rollout.py."""
    import alfworld
    import alfworld.gen.constants as C
    base = os.path.dirname(alfworld.__file__)
    lines = [open(os.path.join(base, "data", "alfred.twl2")).read()]
    names = sorted(set(C.OBJECTS) | set(C.RECEPTACLES))
    words = [re.sub(r"(?<!^)(?=[A-Z])", " ", n).lower() for n in names] + [n.lower() for n in names]
    verbs = ["go to", "take", "from", "move", "to", "put", "in/on", "open", "close", "use", "heat", "with",
             "cool", "clean", "slice", "look", "inventory", "examine", "help", "Nothing happens.",
             "You arrive at"]
    nums = [str(i) for i in range(100)]
    for _ in range(3):  # repeat so frequent units merge into single tokens
        lines += words + verbs + nums + [PROMPT_TEXT]
        lines += [f"{v} {w} {n}" for v in ("go to", "open", "close", "take", "use")
                  for w in words for n in nums[1:4]]
    return lines


def build(out, seed=0):
    """Write tokenizer + random-init model into `out` (atomically). Returns out."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(TAGS), special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(env_corpus(), trainer=trainer)
    # the tags are ordinary text (they must survive decode(skip_special_tokens=True)), but one token each
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", additional_special_tokens=SPECIAL[1:])
    hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(hf_tok), bos_token_id=None, eos_token_id=hf_tok.eos_token_id,
                      pad_token_id=hf_tok.pad_token_id, torch_dtype="float32", **ARCH)
    model = Qwen2ForCausalLM(cfg)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(out)) or ".")
    hf_tok.save_pretrained(tmp)
    # written by hand, not model.save_pretrained: under torch.distributed, transformers writes only on global
    # rank 0 (transformers/distributed/mixin.py, should_save_on_this_rank), and every node builds its own copy
    from safetensors.torch import save_file
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    # lm_head.weight is left out: tied to embed
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "agent_g2_tiny.json"), "w") as f:
        json.dump({"seed": seed, "version": VERSION, "arch": ARCH, "vocab": len(hf_tok)}, f, indent=1)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def tiny_path(cache, seed=0):
    """Path of the cached tiny model for a seed; built on first use."""
    key = hashlib.sha1(json.dumps([VERSION, ARCH, VOCAB, seed]).encode()).hexdigest()[:10]
    path = os.path.join(cache, f"tiny-qwen2-{key}")
    if not os.path.exists(os.path.join(path, "agent_g2_tiny.json")):
        build(path, seed)
    return path


def resolve_model(cfg):
    """cfg.model -> something from_pretrained / vllm.LLM accept ('tiny' -> the cached offline model)."""
    from config import cache_dir
    return tiny_path(cache_dir(cfg), cfg.seed) if cfg.model == "tiny" else cfg.model


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.out:
        print(build(a.out, a.seed))
    else:
        from config import cache_dir
        print(tiny_path(cache_dir(), a.seed))

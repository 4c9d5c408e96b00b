"""Sampling streams (--sample_streams episode, docs/running.md): the seed of each episode's turn from its key,
and the HF engine's per-row sampling. rollout.py draws each turn's seed here; vLLM takes it as a per-request
SamplingParams.seed, the HF engine through RowStreams.

Contract. stream_seed(*key, turn) -> a seed in [0, 2^63), a pure function of the episode's key and turn: an
episode's samples do not depend on what shares its engine call.
"""
import hashlib

import torch


def stream_seed(*key):
    """The seed of one sampling stream (--sample_streams episode) from its key, e.g. ("train", seed, step,
    batch position, rollout, turn): a hash, the same in every process and on every rank, in [0, 2^63)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") % 2**63


class RowStreams:
    """HF generate's sampling with a stream per request (--sample_streams episode): at reply position j, row b
    takes argmax(logits / T + G), G Gumbel noise drawn from stream_seed(seed_b, j) alone; that is a draw from
    softmax(logits / T) restricted to what the trie mask left (the Gumbel-max trick), the same draw whatever
    else is in the batch. P: the prompts' padded length. A transformers logits processor: (ids [b, P + j],
    scores [b, V]) -> [b, V]."""

    def __init__(self, seeds, P, temperature):
        self.seeds, self.P, self.T = seeds, P, temperature

    def __call__(self, input_ids, scores):
        j = input_ids.shape[1] - self.P
        g = torch.stack([torch.rand(scores.shape[-1], dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(stream_seed(s, j)))
                         for s in self.seeds])  # [b, V] uniform
        return scores / self.T - torch.log(-torch.log(g.clamp(min=1e-300))).to(scores)

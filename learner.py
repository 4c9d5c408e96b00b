"""The forward/backward passes of one GRPO update, for train.py's update(): micro-batching, pi_old scored by the
trainer, and the backward of L = L_GRPO + eta * L_aux on this rank's rows. The math itself (weights, ratios, clip,
KL, TIS, entropy) is grpo.py's; this file feeds it the model's log-probs and keeps every rank in step.

    learn = Learner(cfg, model, ref, tok, device, world, ddp, fsdp, prec, old_from_trainer)
    learn.old_logprobs(rows)                       # sets row["old_lp"]; -> engine vs trainer mismatch sums
    parts = learn.loss_terms(rows, aux, counts, ep_tok)   # backward of this rank's share; -> logged sums

Rows are dicts: prompt_ids, response_ids (lists of ints), logprobs (the engine's, one per response token), adv
(the row's advantage), eid (its episode). Under DDP/FSDP every rank runs the same number of forward/backward
passes (padded with zero-loss passes on a one-token DUMMY row): FSDP all-gathers in each pass and DDP reduces in
the last, so a rank with fewer rows must still join them.
"""
import contextlib

import torch

from grpo import agg_weights, logprob_mismatch, policy_loss, tis_weights
from parallel import all_max
from rollout import response_logprobs


class Learner:
    def __init__(self, cfg, model, ref, tok, device, world=1, ddp=False, fsdp=False, prec=contextlib.nullcontext,
                 old_from_trainer=False):
        self.cfg, self.model, self.ref, self.device, self.old_from_trainer = cfg, model, ref, device, old_from_trainer
        self.world, self.ddp, self.fsdp, self.prec, self.pad_id = world, ddp, fsdp, prec, tok.pad_token_id
        self.DUMMY = {"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]}

    def token_logprobs(self, m, rows, entropy=False):
        """-> (log-probs [b, T], mask [b, T][, entropy [b, T]]) of the response tokens under the distribution the
        engine sampled from: trie-restricted (--constrained) and at --temperature."""
        return response_logprobs(m, rows, self.pad_id, self.device, self.cfg.temperature, entropy)

    def micro_batches(self, rows):  # sorted by length: less padding per micro-batch
        rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
        return [rows[i:i + self.cfg.micro_batch] for i in range(0, len(rows), self.cfg.micro_batch)]

    def padded(self, mb, key, like):  # per-row lists of per-token values -> [b, T] like the trainer's log-probs
        out = torch.zeros_like(like)
        for b, r in enumerate(mb):
            out[b, :len(r[key])] = torch.as_tensor(r[key], dtype=out.dtype, device=self.device)
        return out

    @torch.no_grad()
    def old_logprobs(self, rows):
        """pi_old by the trainer, with the weights before this batch's first optimizer step (verl's convention:
        the trainer recomputes old_log_prob, verl/trainer/ppo/ray_trainer.py). Scored in the same micro-batches as
        the loss, so with one update per batch the ratio is exactly 1. Sets row["old_lp"]; returns the engine vs
        trainer mismatch on this rank: (sum |d|, max |d|, sum k3, tokens)."""
        mbs = self.micro_batches(rows)
        pad = (all_max(len(mbs), self.ddp) - len(mbs)) if self.fsdp else 0  # FSDP: matched all-gathers
        mis = [0.0, 0.0, 0.0, 0.0]
        for mb in mbs + [[self.DUMMY]] * pad:
            with self.prec():  # the loss's own path (with the entropy: one log_softmax), so the ratio is exactly 1
                lp, m = self.token_logprobs(self.model, mb, self.cfg.entropy_coef > 0)[:2]
            if mb[0] is self.DUMMY:
                continue
            for b, r in enumerate(mb):
                r["old_lp"] = lp[b, :len(r["response_ids"])].float().tolist()
            s, mx, k3, n = logprob_mismatch(lp.float(), self.padded(mb, "logprobs", lp).float(), m)
            mis = [mis[0] + s, max(mis[1], mx), mis[2] + k3, mis[3] + n]
        return mis

    def loss_terms(self, rows, aux, counts, ep_tok):
        """Backward of this rank's share of L = L_GRPO + eta L_aux, one micro-batch at a time. Weights use global
        counts (tokens, rows, episodes, aux tokens over all ranks), so DDP's gradient average equals the
        single-process loss on the global batch. ep_tok: response tokens per episode id (loss_agg "episode").
        Returns this rank's sums of the logged terms, "ratio_dev" as a max and "finite" as 0/1."""
        cfg = self.cfg
        parts = {"pg": 0.0, "kl": 0.0, "entropy": 0.0, "aux": 0.0, "clipped": 0.0, "ratio_dev": 0.0, "finite": 1.0}
        work = [("pg", mb) for mb in (self.micro_batches(rows) if cfg.mode == "grpo" else [])]
        work += [("aux", mb) for mb in self.micro_batches(aux)] if cfg.mode != "grpo" or cfg.eta > 0 else []
        work += [("none", [self.DUMMY])] * (all_max(max(len(work), 1), self.ddp) - len(work))
        for j, (kind, mb) in enumerate(work):
            skip_sync = self.ddp and not self.fsdp and j < len(work) - 1  # DDP: reduce once, in the last backward
            with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                with self.prec():  # bf16 compute over the fp32 weights
                    loss = self.micro_loss(kind, mb, counts, ep_tok, parts)
                if self.fsdp and self.ref is not None and kind != "pg":  # the sharded reference all-gathers in
                    with torch.no_grad(), self.prec():  # every pass, after the policy as in a pg pass
                        self.token_logprobs(self.ref, [self.DUMMY])
                if not torch.isfinite(loss):  # still backward (every rank joins the same reductions); no step
                    parts["finite"] = 0.0
                loss.backward()
        return parts

    def micro_loss(self, kind, mb, counts, ep_tok, parts):
        """One micro-batch's loss (already scaled by world: DDP averages gradients over ranks); adds its logged
        terms to parts. kind: pg (the clipped policy loss) | aux (expert-prefix NLL) | none (a zero-loss pass)."""
        cfg, world = self.cfg, self.world
        if kind == "none":
            return self.token_logprobs(self.model, mb)[0].sum() * 0.0
        if kind == "aux":  # teacher forcing on the expert prefix: -sum log pi(a*_t | s_t)
            lp, m = self.token_logprobs(self.model, mb)  # [b, T]
            w = cfg.eta if cfg.mode == "grpo" else 1.0  # aux_only / SFT: the NLL alone
            if cfg.aux_agg == "prefix-mean":  # the authors' prefix SFT: each row's token mean, weight 1/n in its
                # n-step prefix, normalised by the weights [ZJU-REAL/Agent-G2 verl/workers/actor/dp_actor.py]
                row_w = torch.tensor([1.0 / r["n"] for r in mb], device=self.device)  # [b]
                row_mean = (lp * m).sum(-1) / m.sum(-1).clamp(min=1)  # [b]
                loss = -(row_w * row_mean).sum() / max(counts["aux_weight"], 1e-12) * w * world
            else:  # token-mean: every expert token of the mini-batch weighs the same
                loss = -(lp * m).sum() / max(counts["aux_tokens"], 1) * w * world
            parts["aux"] += loss.item() / w / world  # = local sum / global count
            return loss
        lp, m, ent = self.token_logprobs(self.model, mb, True) if cfg.entropy_coef > 0 else \
            (*self.token_logprobs(self.model, mb), None)  # [b, T] each
        eng = self.padded(mb, "logprobs", lp)  # the engine's log-probs of the sampled tokens
        old = self.padded(mb, "old_lp", lp) if self.old_from_trainer else eng  # pi_old: before this batch's step
        tis = tis_weights(old, eng, cfg.tis_cap) if cfg.tis_cap > 0 else None
        rlp = None
        if self.ref is not None:
            with torch.no_grad():
                rlp = self.token_logprobs(self.ref, mb)[0]
        w = agg_weights(cfg.loss_agg, torch.tensor([len(r["response_ids"]) for r in mb]),
                        torch.tensor([ep_tok[r["eid"]] for r in mb]), counts["tokens"], counts["rows"],
                        counts["episodes"]).to(self.device)  # [b]
        adv = torch.tensor([r["adv"] for r in mb], device=self.device)  # [b]
        loss, st = policy_loss(lp, old, adv, m, w, cfg.clip_eps, rlp, cfg.kl_coef, tis, cfg.dual_clip, ent,
                               cfg.entropy_coef)
        for k in ("pg", "kl", "entropy", "clipped"):
            parts[k] += st[k]
        parts["ratio_dev"] = max(parts["ratio_dev"], st["ratio_dev"])
        return loss * world

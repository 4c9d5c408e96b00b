"""One batch's GRPO update, whole: the rows' token log-probs under a model, pi_old scored by the trainer, the
PPO mini-batches, the backward of L = L_GRPO + eta * L_aux one micro-batch at a time, the clip and the
optimizer step. The math (weights, ratios, clip, KL, TIS, entropy) is grpo.py's; this file runs the model
through it and keeps every rank in step. train.py calls it once a step:

    learn = Update(cfg, model, policy, ref, opt, tok, device, world, ddp, fsdp, prec, old_from_trainer)
    out = learn.batch(rows, aux)   # -> {"pg", "kl", "entropy", "aux", "clipfrac", "ratio_dev", "update_rel",
                                   #     "grad_norm"(, "lp_diff_mean", "lp_diff_max", "lp_kl")}

Rows are dicts: prompt_ids, response_ids (lists of ints), logprobs (the engine's, one per response token), adv
(the row's advantage), eid (its episode), gid (its group); aux rows also n (their prefix's length). Under
DDP/FSDP every rank runs the same number of forward/backward passes (padded with zero-loss passes on a
one-token DUMMY row): FSDP all-gathers in each pass and DDP reduces in the last, so a rank with fewer rows
must still join them.
"""
import contextlib
import math

import torch

from grpo import (adamw_update_norm, agg_weights, logprob_mismatch, mini_batches, pad_options, policy_loss,
                  tis_weights, token_logprobs, token_logprobs_entropy, trie_options)
from plumbing.parallel import all_max, all_sum, reduce_dict


def response_logprobs(model, rows, pad_id, device="cpu", temperature=1.0, entropy=False):
    """Per-token log-probs of each row's response_ids after its prompt_ids under `model` (teacher forcing), at
    the rollout temperature and, for rows with "allowed", restricted to the admissible-reply trie: the
    distribution the engine sampled from. Returns (lp [b, n], mask [b, n]), n = the longest response; with
    entropy=True also the entropy of that distribution per position ([b, n], grpo.token_logprobs_entropy).
    Prompts are left-padded so every response starts at column P; explicit position ids keep RoPE as unpadded.
    Only the response positions get logits (logits_to_keep): full-vocabulary logits over whole sequences would
    dominate activation memory (151,936 x 2.5k tokens = 1.5 GB per row in fp32 for Qwen2.5)."""
    P, n = max(len(r["prompt_ids"]) for r in rows), max(len(r["response_ids"]) for r in rows)
    input_ids = torch.full((len(rows), P + n), pad_id, dtype=torch.long)  # [b, P + n]
    attention = torch.zeros((len(rows), P + n), dtype=torch.long)
    for b, r in enumerate(rows):
        ids, start = r["prompt_ids"] + r["response_ids"], P - len(r["prompt_ids"])
        input_ids[b, start:start + len(ids)] = torch.tensor(ids)
        attention[b, start:start + len(ids)] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [b, P + n]
    # mask, targets: [b, n]
    mask = torch.tensor([[1.0] * len(r["response_ids"]) + [0.0] * (n - len(r["response_ids"])) for r in rows])
    targets = torch.tensor([r["response_ids"] + [pad_id] * (n - len(r["response_ids"])) for r in rows])
    opts = pad_options([trie_options(r["response_ids"], r["allowed"]) if r.get("allowed") else None
                        for r in rows], n) if any(r.get("allowed") for r in rows) else None
    mask, targets = mask.to(device), targets.to(device)
    # the logits at column j predict token j + 1: columns P-1 .. P+n-2 score the response (the last n + 1
    # are kept)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                   position_ids=positions.to(device), logits_to_keep=n + 1, use_cache=False).logits[:, :n]
    # logits: [b, n, V]
    opts = None if opts is None else opts.to(device)
    if entropy:  # one log_softmax for both: a single [b, n, V] fp32 tensor kept for the backward
        lp, ent = token_logprobs_entropy(logits, targets, opts, temperature)  # [b, n] each
        return lp * mask, mask, ent * mask
    lp = token_logprobs(logits, targets, opts, temperature)  # [b, n]
    return lp * mask, mask


class Update:
    """The update of one batch on this rank (see the module docstring). model: what the forward runs (the DDP
    wrapper, or the policy itself); policy: the module whose parameters the optimizer owns."""

    def __init__(self, cfg, model, policy, ref, opt, tok, device, world=1, ddp=False, fsdp=False,
                 prec=contextlib.nullcontext, old_from_trainer=False):
        self.cfg, self.model, self.policy, self.ref, self.opt = cfg, model, policy, ref, opt
        self.device, self.world, self.ddp, self.fsdp, self.prec = device, world, ddp, fsdp, prec
        self.old_from_trainer, self.pad_id = old_from_trainer, tok.pad_token_id
        self.DUMMY = {"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]}

    def batch(self, rows, aux):
        """The batch's optimizer steps: ceil(global rows / --ppo_mini_batch) mini-batches (0: one), each
        task's step rows and aux rows spread over them in order (grpo.mini_batches: the same cut on 1 GPU or
        8), each mini-batch's loss normalised by its own global counts (verl's dp_actor: several optimizer
        steps a batch). pi_old is scored once, before the first step. -> the logged terms (pg, kl, entropy,
        aux: each mini-batch's mean, averaged), clipfrac, ratio_dev, update_rel (summed relative update size),
        grad_norm (mean; nan if any step was non-finite), and with trainer pi_old the engine-vs-trainer
        gap."""
        cfg = self.cfg
        n_rows = all_sum(len(rows), self.ddp)
        n_mb = max(1, -(-n_rows // cfg.ppo_mini_batch)) if cfg.ppo_mini_batch else 1
        parts = list(zip(mini_batches(rows, n_mb), mini_batches(aux, n_mb)))
        # rows with zero advantage and no KL term carry no gradient: no forward pass (they still count in
        # the means)
        keep = (lambda mb: mb) if self.ref is not None else (lambda mb: [r for r in mb if r["adv"] != 0.0])
        sums = {"pg": 0.0, "kl": 0.0, "entropy": 0.0, "aux": 0.0, "clipped": 0.0,
                "tokens": float(sum(len(r["response_ids"]) for r in rows)),
                "lp_diff": 0.0, "lp_k3": 0.0, "lp_tokens": 0.0}  # engine vs trainer on the sampled tokens
        maxima = {"ratio_dev": 0.0, "lp_diff": 0.0}
        for mb, _ in parts if self.old_from_trainer and cfg.mode == "grpo" else []:
            gap = self.old_logprobs(keep(mb))
            for k in ("lp_diff", "lp_k3", "lp_tokens"):
                sums[k] += gap[k]
            maxima["lp_diff"] = max(maxima["lp_diff"], gap["lp_diff_max"])
        update_rel, grad_norms = 0.0, []
        for mb, aux_mb in parts:
            ep_tok = {}  # response tokens per episode within the mini-batch (the "episode" aggregation)
            for r in mb:
                ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
            counts = reduce_dict({"tokens": sum(ep_tok.values()), "rows": len(mb), "episodes": len(ep_tok),
                                  "aux_tokens": sum(len(r["response_ids"]) for r in aux_mb),
                                  "aux_weight": sum(1.0 / r["n"] for r in aux_mb)}, self.ddp)
            self.opt.zero_grad(set_to_none=self.fsdp or not self.ddp)  # DDP: grads stay views of its buckets
            terms = self.loss_terms(keep(mb), aux_mb, counts, ep_tok)
            finite = all_max(int(terms["finite"] < 1), self.ddp) == 0
            maxima["ratio_dev"] = max(maxima["ratio_dev"], terms["ratio_dev"])
            for k in ("pg", "kl", "entropy", "aux", "clipped"):
                sums[k] += terms[k]
            # the gradient norm is the same on every rank (DDP: reduced grads; FSDP: a global norm), so is
            # this step
            grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip).item() \
                if finite else math.nan
            grad_norms.append(grad_norm)
            if not math.isfinite(grad_norm):
                self.opt.zero_grad(set_to_none=True)
            elif grad_norm > 0:  # no signal, no step: Adam would turn a zero gradient into a full-size move
                self.opt.step()
                update_rel += self.update_size()
        sums, maxima = reduce_dict(sums, self.ddp), reduce_dict(maxima, self.ddp, "max")
        out = {k: sums[k] / n_mb for k in ("pg", "kl", "entropy", "aux")}
        out.update(clipfrac=sums["clipped"] / max(sums["tokens"], 1),
                   # max |pi / pi_old - 1|: 0 with one mini-batch, > 0 from the 2nd
                   ratio_dev=maxima["ratio_dev"],
                   update_rel=update_rel,
                   grad_norm=(sum(grad_norms) / len(grad_norms) if all(map(math.isfinite, grad_norms))
                              else math.nan))
        if self.old_from_trainer:  # how far the engine that sampled is from the trainer that scores
            n = max(sums["lp_tokens"], 1)
            out.update(lp_diff_mean=sums["lp_diff"] / n, lp_diff_max=maxima["lp_diff"],
                       lp_kl=sums["lp_k3"] / n)
        return out

    def update_size(self):
        """||theta_new - theta_old|| / ||theta_old|| of the step just taken, from AdamW's state
        (grpo.adamw_update_norm: no copy of the weights); FSDP: this rank's shards, summed over ranks."""
        sq = reduce_dict(dict(zip(("delta", "theta"), adamw_update_norm(self.opt))), self.fsdp)
        return math.sqrt(sq["delta"] / max(sq["theta"], 1e-30))

    def token_logprobs(self, model, rows, entropy=False):
        """-> (log-probs [b, T], mask [b, T][, entropy [b, T]]) of the response tokens under the distribution
        the engine sampled from: trie-restricted (--constrained) and at --temperature."""
        return response_logprobs(model, rows, self.pad_id, self.device, self.cfg.temperature, entropy)

    def micro_batches(self, rows):  # sorted by length: less padding per micro-batch
        rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
        return [rows[i:i + self.cfg.micro_batch] for i in range(0, len(rows), self.cfg.micro_batch)]

    # per-row lists of per-token values -> [b, T] like the trainer's log-probs
    def padded(self, mb, key, like):
        out = torch.zeros_like(like)
        for b, r in enumerate(mb):
            out[b, :len(r[key])] = torch.as_tensor(r[key], dtype=out.dtype, device=self.device)
        return out

    @torch.no_grad()
    def old_logprobs(self, rows):
        """pi_old by the trainer, with the weights before this batch's first optimizer step (verl's
        convention: the trainer recomputes old_log_prob, verl/trainer/ppo/ray_trainer.py). Scored in the same
        micro-batches as the loss, so with one update per batch the ratio is exactly 1. Sets row["old_lp"];
        returns the engine vs trainer gap on this rank: {"lp_diff": sum |d|, "lp_diff_max": max |d|, "lp_k3":
        sum k3, "lp_tokens"}."""
        mbs = self.micro_batches(rows)
        pad = (all_max(len(mbs), self.ddp) - len(mbs)) if self.fsdp else 0  # FSDP: matched all-gathers
        gap = {"lp_diff": 0.0, "lp_diff_max": 0.0, "lp_k3": 0.0, "lp_tokens": 0.0}
        for mb in mbs + [[self.DUMMY]] * pad:
            # the loss's own path (with the entropy: one log_softmax), so the ratio is exactly 1
            with self.prec():
                lp, mask = self.token_logprobs(self.model, mb, self.cfg.entropy_coef > 0)[:2]
            if mb[0] is self.DUMMY:
                continue
            for b, r in enumerate(mb):
                r["old_lp"] = lp[b, :len(r["response_ids"])].float().tolist()
            engine_lp = self.padded(mb, "logprobs", lp).float()
            diff, diff_max, k3, n = logprob_mismatch(lp.float(), engine_lp, mask)
            gap = {"lp_diff": gap["lp_diff"] + diff, "lp_diff_max": max(gap["lp_diff_max"], diff_max),
                   "lp_k3": gap["lp_k3"] + k3, "lp_tokens": gap["lp_tokens"] + n}
        return gap

    def loss_terms(self, rows, aux, counts, ep_tok):
        """Backward of this rank's share of L = L_GRPO + eta L_aux, one micro-batch at a time. Weights use
        global counts (tokens, rows, episodes, aux tokens over all ranks), so DDP's gradient average equals
        the single-process loss on the global batch. ep_tok: response tokens per episode id (loss_agg
        "episode"). Returns this rank's sums of the logged terms, "ratio_dev" as a max and "finite" as 0/1."""
        cfg = self.cfg
        terms = {"pg": 0.0, "kl": 0.0, "entropy": 0.0, "aux": 0.0, "clipped": 0.0, "ratio_dev": 0.0,
                 "finite": 1.0}
        work = [("pg", mb) for mb in (self.micro_batches(rows) if cfg.mode == "grpo" else [])]
        work += [("aux", mb) for mb in self.micro_batches(aux)] if cfg.mode != "grpo" or cfg.eta > 0 else []
        work += [("none", [self.DUMMY])] * (all_max(max(len(work), 1), self.ddp) - len(work))
        for j, (kind, mb) in enumerate(work):
            # DDP: reduce once, in the last backward
            skip_sync = self.ddp and not self.fsdp and j < len(work) - 1
            with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                with self.prec():  # bf16 compute over the fp32 weights
                    loss = self.micro_loss(kind, mb, counts, ep_tok, terms)
                # the sharded reference all-gathers in
                if self.fsdp and self.ref is not None and kind != "pg":
                    with torch.no_grad(), self.prec():  # every pass, after the policy as in a pg pass
                        self.token_logprobs(self.ref, [self.DUMMY])
                if not torch.isfinite(loss):  # still backward (every rank joins the same reductions); no step
                    terms["finite"] = 0.0
                loss.backward()
        return terms

    def micro_loss(self, kind, mb, counts, ep_tok, terms):
        """One micro-batch's loss (already scaled by world: DDP averages gradients over ranks); adds its
        logged terms to `terms`. kind: pg (the clipped policy loss) | aux (expert-prefix NLL) | none (a
        zero-loss pass)."""
        cfg, world = self.cfg, self.world
        if kind == "none":
            return self.token_logprobs(self.model, mb)[0].sum() * 0.0
        if kind == "aux":  # teacher forcing on the expert prefix: -sum log pi(a*_t | s_t)
            lp, mask = self.token_logprobs(self.model, mb)  # [b, T]
            w = cfg.eta if cfg.mode == "grpo" else 1.0  # aux_only / SFT: the NLL alone
            # the authors' prefix SFT: each row's token mean, weight 1/n in its n-step prefix, normalised by
            # the weights [ZJU-REAL/Agent-G2 verl/workers/actor/dp_actor.py]
            if cfg.aux_agg == "prefix-mean":  # [released]
                row_w = torch.tensor([1.0 / r["n"] for r in mb], device=self.device)  # [b]
                row_mean = (lp * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [b]
                loss = -(row_w * row_mean).sum() / max(counts["aux_weight"], 1e-12) * w * world
            else:  # token-mean: every expert token of the mini-batch weighs the same
                loss = -(lp * mask).sum() / max(counts["aux_tokens"], 1) * w * world
            terms["aux"] += loss.item() / w / world  # = local sum / global count
            return loss
        if cfg.entropy_coef > 0:
            lp, mask, ent = self.token_logprobs(self.model, mb, True)  # [b, T] each
        else:
            (lp, mask), ent = self.token_logprobs(self.model, mb), None
        eng = self.padded(mb, "logprobs", lp)  # the engine's log-probs of the sampled tokens
        # pi_old: before this batch's step
        old = self.padded(mb, "old_lp", lp) if self.old_from_trainer else eng
        tis = tis_weights(old, eng, cfg.tis_cap) if cfg.tis_cap > 0 else None
        ref_lp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_lp = self.token_logprobs(self.ref, mb)[0]
        w = agg_weights(cfg.loss_agg, torch.tensor([len(r["response_ids"]) for r in mb]),
                        torch.tensor([ep_tok[r["eid"]] for r in mb]), counts["tokens"], counts["rows"],
                        counts["episodes"]).to(self.device)  # [b]
        adv = torch.tensor([r["adv"] for r in mb], device=self.device)  # [b]
        loss, stats = policy_loss(lp, old, adv, mask, w, cfg.clip_eps, ref_lp, cfg.kl_coef, tis,
                                  cfg.dual_clip, ent, cfg.entropy_coef)
        for k in ("pg", "kl", "entropy", "clipped"):
            terms[k] += stats[k]
        terms["ratio_dev"] = max(terms["ratio_dev"], stats["ratio_dev"])
        return loss * world

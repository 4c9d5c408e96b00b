"""Keeping ranks in step during the update: the one wrapper train.py's update_policy goes through, so that it
reads as one process runs it. Machinery: a researcher may trust it unread.

Contract. Ranks(cfg, model, policy, ref, terms, score, ddp, fsdp, world, prec, old_from_trainer, dummy) serves
the update's calls in its order (sum, tally, total, passes, backward, clip_grad_norm, update_size) and stop().
What goes in: this rank's rows and losses. What comes out: what one process would compute on the whole batch.
What it promises under DDP / FSDP2 (in one process every promise holds trivially):
  1. every rank runs as many forward/backward passes in a mini-batch as the busiest one (zero-loss passes on a
     one-token dummy row after its own): FSDP all-gathers in every pass and DDP reduces in the last, so a rank
     with fewer rows must still join them; pi_old's scoring passes too, under FSDP;
  2. DDP reduces the gradients once, in a mini-batch's last backward (no_sync before it);
  3. each rank back-propagates world x its share of the global loss: DDP averages, so the gradient is the
     gradient of the global loss;
  4. the counts the loss is normalised by, the gradient norm and the decision to step (every rank's losses
     finite) are the same on every rank;
  5. FSDP2: the sharded reference all-gathers in every pass, after the policy, whether or not a term read it;
  6. the logged values are summed (maxima maxed) over micro-batches, mini-batches and ranks; update_rel is
     ||theta_new - theta_old|| / ||theta_old|| over all shards.
tests/test_parallel.py checks 1-4 and 6 on two gloo ranks: the update there equals one process's on the same
batch; tests/test_grpo.py checks the one-process update against the loss written out by hand.
"""
import contextlib
import math

import torch

from plumbing.parallel import all_max, all_sum, reduce_dict

LOGGED = ("pg", "kl", "entropy", "aux", "clipfrac", "ratio_dev")  # in every update's output (0.0 when unused)
# the update's own names: no term stat may take one
RESERVED = {"tokens", "finite", "update_rel", "skipped", "grad_norm", "term_stats", "lp_diff", "lp_k3",
            "lp_tokens", "lp_diff_mean", "lp_diff_max", "lp_kl"}


def check_terms(terms):
    """Loss terms' stat names unique and clear of the update's own, rows "step" or "aux": else ValueError.
    -> {"step": terms reading step rows, "aux": terms reading aux rows}."""
    by_rows = {kind: [t for t in terms if t.rows == kind] for kind in ("step", "aux")}
    names = [k for t in terms for k in (*t.stats, *t.maxima)]
    clash = {k for k in names if names.count(k) > 1} | set(names) & RESERVED
    if clash or len(by_rows["step"]) + len(by_rows["aux"]) < len(terms):
        raise ValueError(f"loss terms: stat names must be unique ({sorted(clash)}), rows step or aux")
    return by_rows


class Ranks:
    """The update's view of the ranks (see the module's contract). model: what the forward runs (the DDP
    wrapper, or the policy); policy: whose parameters the optimizer owns; score(model, rows, entropy=False) ->
    (lp, mask(, entropy)) [b, T]: the run's response_logprobs; prec(): the forward's precision context."""

    def __init__(self, cfg, model, policy, ref, terms, score, ddp=False, fsdp=False, world=1,
                 prec=contextlib.nullcontext, old_from_trainer=False, dummy=None):
        self.cfg, self.model, self.policy, self.ref = cfg, model, policy, ref
        self.terms, self.score = terms, score
        self.ddp, self.fsdp, self.world, self.prec = ddp, fsdp, world, prec
        self.old_from_trainer, self.dummy, self.bad, self.finite = old_from_trainer, dummy, 0, True
        self.set_to_none = fsdp or not ddp  # DDP: gradients stay views of its buckets (zeroed, not freed)

    def sum(self, n):  # an int over ranks
        return all_sum(n, self.ddp)

    def total(self, counts):  # {name: number} over ranks
        return reduce_dict(counts, self.ddp)

    def passes(self, work):
        """Yield this rank's (kind, micro-batch) pairs, the caller's forward and backward running inside each
        (DDP: no_sync but in the last pass), then run zero-loss passes on the dummy row up to what any rank
        runs (at least one)."""
        self.finite = True
        n = all_max(max(len(work), 1), self.ddp)
        for j in range(n):
            skip_sync = self.ddp and not self.fsdp and j < n - 1  # DDP: reduce once, in the last backward
            with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                if j < len(work):
                    yield work[j]
                    continue
                with self.prec():
                    loss = self.score(self.model, [self.dummy])[0].sum() * 0.0
                self.backward(loss, None, scale=False)

    def backward(self, loss, batch, scale=True):
        """world x loss backward (DDP averages over ranks); FSDP: the reference's pass if no term made one. A
        non-finite loss is still back-propagated (every rank joins the same reductions) and stops the step."""
        loss = loss * self.world if scale else loss
        if self.fsdp and self.ref is not None and (batch is None or batch.ref_scored is None):
            with torch.no_grad():  # the sharded reference all-gathers in every pass, after the policy
                self.score(self.ref, [self.dummy])
        if not torch.isfinite(loss):
            self.finite = False
        loss.backward()

    def clip_grad_norm(self, max_norm):
        """The clipped gradient's norm, the same on every rank; nan (gradients dropped) if any rank's loss in
        this mini-batch was not finite."""
        if all_max(int(not self.finite), self.ddp):
            self.policy.zero_grad(set_to_none=True)
            return math.nan
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_norm).item()
        if not math.isfinite(norm):
            self.policy.zero_grad(set_to_none=True)
        return norm

    def update_size(self, opt):  # ||theta_new - theta_old|| / ||theta_old|| (FSDP: shards summed over ranks)
        sq = reduce_dict(dict(zip(("delta", "theta"), adamw_update_norm(opt))), self.fsdp)
        return math.sqrt(sq["delta"] / max(sq["theta"], 1e-30))

    def tally(self, rows, mbs):
        """The batch's logged values, started: pi_old scored by the trainer first when it is (it sets
        row["old_lp"] on every mini-batch's rows, before the first step). -> a Tally."""
        return Tally(self, rows, self.score_old(mbs))

    @torch.no_grad()
    def score_old(self, mbs):
        """pi_old by the trainer, every mini-batch before the first step (verl recomputes old_log_prob:
        verl/trainer/ppo/ray_trainer.py), in the loss's micro-batches and by its formula: the ratio is exactly
        1 at the first step. -> the engine-vs-trainer gap: sums lp_diff, lp_k3, lp_tokens; lp_diff_max."""
        from grpo import forward_rows, micro_batches, padded
        gap = {"lp_diff": 0.0, "lp_k3": 0.0, "lp_tokens": 0.0, "lp_diff_max": 0.0}
        for rows in mbs if self.old_from_trainer and any(t.old for t in self.terms) else []:
            micro = micro_batches(forward_rows(rows, self.terms), self.cfg)
            pad = (all_max(len(micro), self.ddp) - len(micro)) if self.fsdp else 0  # FSDP: as many gathers
            for mb in micro + [[self.dummy]] * pad:
                with self.prec():
                    lp, mask = self.score(self.model, mb)
                if mb[0] is self.dummy:
                    continue
                for b, r in enumerate(mb):
                    r["old_lp"] = lp[b, :len(r["response_ids"])].float().tolist()
                engine_lp = padded(mb, "logprobs", lp).float()
                diff, diff_max, k3, n = logprob_mismatch(lp.float(), engine_lp, mask)
                gap.update(lp_diff=gap["lp_diff"] + diff, lp_k3=gap["lp_k3"] + k3,
                           lp_tokens=gap["lp_tokens"] + n, lp_diff_max=max(gap["lp_diff_max"], diff_max))
        return gap

    def stop(self, update):  # -> (why, checkpoint?) or None
        """Divergence (non-finite weights, an update beyond --max_update) stops the run with no checkpoint of
        these weights; --max_bad_steps steps in a row with a non-finite loss (those mini-batches took no step;
        the weights were just checked finite) stop it with one."""
        self.bad = self.bad + 1 if update["skipped"] else 0
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.policy.parameters()]
        if all_max(int(not all(torch.isfinite(p).all() for p in local)), self.ddp):
            return "the weights hold non-finite values (no checkpoint of them written)", False
        if not update["update_rel"] <= self.cfg.max_update:  # NaN too
            return (f"the update moved the weights by {update['update_rel']:.3g} of their norm, beyond "
                    f"--max_update {self.cfg.max_update:g} (no checkpoint of them written)"), False
        if self.bad >= self.cfg.max_bad_steps:
            return (f"{self.bad} steps in a row with a non-finite loss (the weights are finite: checkpoint "
                    "written)"), True


class Tally:
    """The update's logged values: each mini-batch's term stats (new() -> a dict the terms add to; add() folds
    it in with the step's grad norm and size), then summary() over ranks."""

    def __init__(self, ranks, rows, gap):
        self.ranks, self.terms, self.gap, self.steps = ranks, ranks.terms, gap, []
        self.sums = {**{k: 0.0 for t in self.terms for k in t.stats},
                     "tokens": float(sum(len(r["response_ids"]) for r in rows))}
        self.maxima = {k: 0.0 for t in self.terms for k in t.maxima}

    def new(self):
        return {k: 0.0 for t in self.terms for k in (*t.stats, *t.maxima)}

    def add(self, stats, grad_norm, update_rel):
        for k in self.maxima:
            self.maxima[k] = max(self.maxima[k], stats[k])
        for k in [k for t in self.terms for k in t.stats]:
            self.sums[k] += stats[k]
        self.steps.append((grad_norm, update_rel))

    def summary(self, n_mb):
        """Over ranks: LOGGED (each term's finish), other term stats (named in "term_stats"), update_rel
        (summed), skipped (non-finite mini-batches), grad_norm (mean over the steps taken; nan: none) and,
        when the trainer scored pi_old, the engine-vs-trainer gap (lp_diff_mean, lp_diff_max, lp_kl)."""
        ddp, gap = self.ranks.ddp, self.gap
        sums = reduce_dict({**self.sums, **{k: gap[k] for k in ("lp_diff", "lp_k3", "lp_tokens")}}, ddp)
        maxima = reduce_dict({**self.maxima, "lp_diff": gap["lp_diff_max"]}, ddp, "max")
        out = dict.fromkeys(LOGGED, 0.0)
        for t in self.terms:
            out.update(t.finish(sums, maxima, n_mb, sums["tokens"]))
        more = [k for k in out if k not in LOGGED]
        norms = [g for g, _ in self.steps if math.isfinite(g)]
        out.update(update_rel=sum(u for _, u in self.steps), skipped=len(self.steps) - len(norms),
                   grad_norm=sum(norms) / len(norms) if norms else math.nan)
        if self.ranks.old_from_trainer:  # how far the engine that sampled is from the trainer that scores
            n = max(sums["lp_tokens"], 1)
            out.update(lp_diff_mean=sums["lp_diff"] / n, lp_diff_max=maxima["lp_diff"],
                       lp_kl=sums["lp_k3"] / n)
        return {**out, "term_stats": more} if more else out


def logprob_mismatch(old_lp, engine_lp, mask):
    """Engine vs trainer on the engine's samples ([b, T] each) -> (sum |d log p|, max |d|, sum k3 of
    KL(engine || trainer), tokens)."""
    d = (old_lp - engine_lp) * mask  # [b, T]
    k3 = (torch.exp(d) - d - 1) * mask
    return (d.abs().sum().item(), d.abs().max().item() if mask.any() else 0.0, k3.sum().item(),
            mask.sum().item())


def adamw_update_norm(opt, chunk=1 << 22):
    """(||theta_new - theta_old||^2, ||theta_old||^2) of AdamW's last step from its state, with no copy of the
    weights. torch's AdamW (torch/optim/adam.py) does p <- p (1 - lr wd) - u, u = lr / bc1 * m / (sqrt(v) /
    sqrt(bc2) + eps), so delta = -(lr wd p_new + u) / (1 - lr wd): no cancellation; sums in fp64, `chunk`
    elements at a time. FSDP2 shards count their local part."""
    d2 = o2 = 0.0
    loc = lambda t: (t.to_local() if hasattr(t, "to_local") else t).detach().reshape(-1)  # noqa: E731
    for g in opt.param_groups:
        lr, wd, (b1, b2), eps = g["lr"], g["weight_decay"], g["betas"], g["eps"]
        if g.get("amsgrad") or g.get("maximize"):
            raise ValueError("adamw_update_norm: amsgrad / maximize are not supported")
        for p in g["params"]:
            if p.grad is None or p not in opt.state:
                continue
            st = opt.state[p]
            t = float(st["step"])
            c1, c2 = lr / (1 - b1 ** t), math.sqrt(1 - b2 ** t)
            m, v, pn = loc(st["exp_avg"]), loc(st["exp_avg_sq"]), loc(p)
            for i in range(0, pn.numel(), chunk):
                mi, vi, pi = (x[i:i + chunk].float() for x in (m, v, pn))
                delta = -(lr * wd * pi + c1 * mi / (vi.sqrt() / c2 + eps)) / (1 - lr * wd)
                d2 += delta.square().sum(dtype=torch.float64).item()
                o2 += (pi - delta).square().sum(dtype=torch.float64).item()
    return d2, o2

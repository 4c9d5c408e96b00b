"""GRPO, whole: the math on tensors (group advantages, trie-restricted log-probs, the aggregations, the
clipped policy loss with the k3 KL), the paper's two loss terms as objects, and the update that runs a model
through them (pi_old, PPO mini-batches, micro-batches, the optimizer step). It sits beside train.py as
nanoGPT's model.py does; tests/test_grpo.py checks each piece on toy inputs and on the tiny model.

    adv, n_zero = group_advantages(rewards, gid, keep)            # [E] per episode
    n_zero, n_groups = row_advantages(rows, episodes, "traj")     # the same on train.py's step rows
    est = make_advantage(cfg, tasks); n_zero, n_groups = est(rows, episodes)   # --advantage's estimator
    mbs = mini_batches(rows, n_mb)                                # rank-independent PPO mini-batches
    opts = trie_options(response_ids, allowed)                    # allowed next tokens per response position
    lp = token_logprobs(logits, targets, options, temperature)    # [b, T] log pi(a_t | s, a_<t)
    w = agg_weights("episode", row_tokens, episode_tokens, n_tokens, n_rows, n_episodes)   # [b]
    loss, stats = policy_loss(lp, old_lp, adv, mask, w, clip_eps, ref_lp, kl_coef)
    terms = make_terms(cfg, ref)        # the loss terms, at setup: PolicyTerm, AuxTerm, Entropy, variants
    learn = Update(cfg, model, policy, ref, opt, tok, device, world, ddp, fsdp, prec, old_from_trainer, terms)
    out = learn.batch(rows, aux)        # -> {"pg", "kl", "entropy", "aux", "clipfrac", "ratio_dev",
                                        #     "update_rel", "grad_norm"(, "lp_diff_*", "lp_kl"), term stats}

A loss term (class Term) maps one micro-batch to (its loss, {stat: float}); the update sums the active terms'
losses, one backward per micro-batch, and their stats over micro-batches, mini-batches and ranks.

Rows are dicts: prompt_ids, response_ids (lists of ints), logprobs (the engine's, one per response token), adv
(the row's advantage), eid (its episode), gid (its group); aux rows instead gid, t (their prefix step), n
(their prefix's length), success (their group's success rate; None: every episode hit an error). Under
DDP/FSDP every rank runs the same number of forward/backward passes (padded with zero-loss passes on a
one-token DUMMY row): FSDP all-gathers in each pass and DDP reduces in the last, so a rank with fewer rows
must still join them.

Constrained decoding (--constrained 1) samples from the policy restricted to the admissible commands: at each
reply position only the tokens that continue some admissible reply (a token trie) keep their mass,
renormalised. The engines record, and the trainer scores, exactly that distribution. A forced position (one
allowed token) then has log-prob 0 and no gradient, and no mass can drift onto tokens the constraint never
allows.
"""
import contextlib
import io
import math

import torch

from plumbing.packing import pack_rows, packed_logits, packed_micro_batches
from plumbing.parallel import all_max, all_sum, reduce_dict

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "episode")
FREE = -2  # in an allowed reply: from here on any token (a free-text slot); see trie_options


def group_advantages(rewards, gid, keep=None, eps=1e-6):
    """GRPO advantage (r - mean_g) / (std_g + eps) within each group g, unbiased std as verl's torch.std
    [ZJU-REAL/Agent-G2 verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage]. rewards [E], gid [E],
    keep [E] bool (False: an env-error episode, out of its group's statistics, advantage 0). Equal kept
    rewards, or a lone one (verl: mean 0, std 1, so its own advantage; one outcome has no relative signal),
    give 0. -> (adv [E], zero-variance groups among those with a kept episode)."""
    rewards = rewards.double()
    keep = torch.ones_like(rewards, dtype=torch.bool) if keep is None else keep
    adv = torch.zeros_like(rewards)
    n_zero = 0
    for g in torch.unique(gid[keep]):
        sel = (gid == g) & keep  # [E]
        r = rewards[sel]
        sd = r.std() if len(r) > 1 else None  # unbiased; undefined (NaN) for one reward
        if sd is None or sd < 1e-8:
            n_zero += 1
            continue
        adv[sel] = (r - r.mean()) / (sd + eps)
    return adv.float(), n_zero


def row_advantages(rows, episodes, level):
    """group_advantages on the rollout's records; sets row["adv"]. level "traj" (paper): an episode's
    advantage from episode rewards, on each of its rows; "step" (released code): one per row, from row
    rewards. -> (zero-variance groups, groups with a kept unit)."""
    if level not in ("traj", "step"):
        raise ValueError(f"unknown advantage level {level!r} (expected traj or step)")
    err = {e["eid"] for e in episodes if e["error"]}
    units = rows if level == "step" else episodes
    adv, n_zero = group_advantages(torch.tensor([u["reward"] for u in units], dtype=torch.float64),
                                   torch.tensor([u["gid"] for u in units]),
                                   torch.tensor([u["eid"] not in err for u in units]))
    by_eid = {u["eid"]: a for u, a in zip(units, adv.tolist())}
    for j, r in enumerate(rows):
        r["adv"] = adv[j].item() if level == "step" else by_eid[r["eid"]]
    return n_zero, len({u["gid"] for u in units if u["eid"] not in err})


class GRPO:
    """The paper's advantage estimator: row_advantages at --adv_level. An estimator is built once at setup as
    Class(cfg, tasks) and called on each step's rows and episodes: est(rows, episodes) -> (zero-advantage
    groups, groups), setting row["adv"]; stats() -> a dict merged into the step record (none here). Others:
    variants/advantages.py (gigpo, beacon), or --advantage file:Class (README "Hack it")."""

    def __init__(self, cfg, tasks=None):
        self.level = cfg.adv_level

    def __call__(self, rows, episodes):
        return row_advantages(rows, episodes, self.level)

    def stats(self):
        return {}


def make_advantage(cfg, tasks, verbose=True):
    """--advantage: grpo (GRPO), a name in variants/advantages.py, or file:Class; built once at setup, before
    any model loads (a bad milestone file: one line, exit 2). verbose False: its start-up lines are silenced
    (ranks other than 0)."""
    if cfg.advantage == "grpo":
        return GRPO(cfg, tasks)
    from config import fail, variant
    try:
        with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO()):
            return variant("advantages", cfg.advantage)(cfg, tasks)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))


def mini_batches(rows, n_mb):
    """rows -> n_mb mini-batches (one optimizer step each), the same global cut however the groups are spread
    over ranks: each group's rows are split into n_mb near-equal consecutive blocks and mini-batch j takes
    block j of every group. Some may be empty."""
    if n_mb == 1:
        return [list(rows)]
    by_gid = {}
    for r in rows:
        by_gid.setdefault(r["gid"], []).append(r)
    out = [[] for _ in range(n_mb)]
    for group in by_gid.values():
        n = len(group)
        for j in range(n_mb):
            out[j] += group[j * n // n_mb:(j + 1) * n // n_mb]
    return out


def lr_at(step, lr, steps, warmup_frac, schedule="cosine"):
    """Linear warm-up over max(1, warmup_frac * steps) steps, then cosine to 0 at `steps` (or constant)."""
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"unknown lr schedule {schedule!r} (expected cosine or constant)")
    warm = max(1, int(warmup_frac * steps))
    if step < warm:
        return lr * (step + 1) / warm
    if schedule == "constant":
        return lr
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def trie_options(response, allowed):
    """For each position j of `response`, the allowed next tokens: {s[j] for s in allowed that agree with
    response[:j]}. response: token ids; allowed: token-id sequences of every admissible reply, each ending
    with EOS, or with FREE: after that literal start anything may follow (a free-text slot, e.g. a search
    query); or the trie that build_trie made of them.
    -> list (len(response)) of sorted lists, or None where a free slot is open (the whole vocabulary); an
    empty list means the prefix left the trie (never for a reply the constrained engine produced)."""
    node, out = allowed if isinstance(allowed, dict) else build_trie(allowed), []
    for t in response:
        if node is None or FREE in node:  # once in a free slot, to the end
            out += [None if node is not None else []] * (len(response) - len(out))
            break
        out.append(sorted(node))
        node = node.get(t)
    return out


def build_trie(allowed):
    """Token sequences (trie_options' `allowed`) -> nested dicts {token: child}; a FREE key opens a free-text
    slot (nothing after it is kept). One walk from the root gives a position's options (trie_options)."""
    root = {}
    for s in allowed:
        node = root
        for t in s:
            node = node.setdefault(t, {})
            if t == FREE:
                break
    return root


def pad_options(options, T, device=None):
    """Per row, per position lists of allowed ids -> long tensor [b, T, K] padded with -1; K >= 1.
    A row without a constraint (None) is all -1, i.e. the whole vocabulary."""
    K = max([len(o) for row in options if row is not None for o in row if o is not None] + [1])
    out = torch.full((len(options), T, K), -1, dtype=torch.long)
    for b, row in enumerate(options):
        for j, o in enumerate(row or []):
            if o is not None:  # None: a free-text position, unconstrained
                out[b, j, :len(o)] = torch.tensor(o, dtype=torch.long)
    return out.to(device)


def token_logprobs(logits, targets, options=None, temperature=1.0):
    """log pi(target_t) under softmax(logits / temperature), restricted where options say so. logits [b, T,
    V], targets [b, T], options [b, T, K] (-1 = pad; all -1: unconstrained) -> [b, T]."""
    return _logprobs(_scaled(logits, temperature), targets, options)[0]


def _scaled(logits, temperature):  # T = 0 (greedy): score the T = 1 policy
    return logits.float() / (temperature if temperature > 0 else 1.0)


def _logprobs(z, targets, options):
    """token_logprobs on scaled logits z [b, T, V]: the one formula of pi and pi_old (the ratio is exactly 1
    before the first step). -> (lp [b, T], the allowed tokens' logits [b, T, K] or None)."""
    tgt = z.gather(-1, targets[..., None])[..., 0]  # [b, T]
    lse_all = torch.logsumexp(z, -1)  # [b, T]
    if options is None:
        return tgt - lse_all, None
    constrained = (options >= 0).any(-1)  # [b, T]
    opt = z.gather(-1, options.clamp(min=0)).masked_fill(options < 0, float("-inf"))  # [b, T, K]
    lse_opt = torch.logsumexp(opt, -1)  # [b, T]
    return tgt - torch.where(constrained, lse_opt, lse_all), opt


class _EntropyOfLogits(torch.autograd.Function):
    """H(softmax(z)), z [..., V] -> [...], keeping only z (which the log-probs keep anyway) for the backward:
    dH/dz_v = -p_v (log p_v + H)."""

    @staticmethod
    def forward(ctx, z):
        logp = torch.log_softmax(z, -1)
        h = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(z, h)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        z, h = ctx.saved_tensors
        logp = torch.log_softmax(z, -1)
        return -grad_h[..., None] * logp.exp() * (logp + h[..., None])


def token_logprobs_entropy(logits, targets, options=None, temperature=1.0):
    """token_logprobs (bit for bit) and the entropy of the sampled distribution at each position (restricted
    and renormalised where options say so), keeping one [b, T, V] fp32 tensor for the backward as
    token_logprobs does. Arguments as token_logprobs -> (lp [b, T], H [b, T])."""
    z = _scaled(logits, temperature)  # [b, T, V]
    lp, opt = _logprobs(z, targets, options)
    h = _EntropyOfLogits.apply(z)  # [b, T]
    if options is None:
        return lp, h
    q_log = opt - torch.logsumexp(opt, -1, keepdim=True)  # [b, T, K] renormalised over the allowed tokens
    h_opt = -(q_log.exp() * q_log.masked_fill(options < 0, 0.0)).sum(-1)
    return lp, torch.where((options >= 0).any(-1), h_opt, h)


def agg_weights(agg, row_tokens, episode_tokens, n_tokens, n_rows, n_episodes):
    """w [b] such that sum_rows w * sum_t loss_t is the aggregation's mean; row_tokens, episode_tokens [b];
    n_*: global counts (all ranks). token-mean 1 / n_tokens (verl's default, the GPU presets);
    seq-mean-token-sum 1 / n_rows; seq-mean-token-mean 1 / (row_tokens n_rows); episode 1 / (episode_tokens
    n_episodes) (the CPU presets: every episode weighs the same)."""
    row_tokens, episode_tokens = row_tokens.float().clamp(min=1), episode_tokens.float().clamp(min=1)
    if agg == "token-mean":
        return torch.full_like(row_tokens, 1.0 / max(n_tokens, 1))
    if agg == "seq-mean-token-sum":  # [beyond] verl's other aggregations, then the CPU presets' episode mean
        return torch.full_like(row_tokens, 1.0 / max(n_rows, 1))
    if agg == "seq-mean-token-mean":
        return 1.0 / (row_tokens * max(n_rows, 1))
    if agg == "episode":
        return 1.0 / (episode_tokens * max(n_episodes, 1))
    raise ValueError(f"unknown loss aggregation {agg!r} (expected one of {AGGS})")


def policy_loss(lp, old_lp, adv, mask, w, clip_eps, ref_lp=None, kl_coef=0.0, tis=None, dual_clip=0.0):
    """Clipped GRPO surrogate + kl_coef * k3 KL, weighted. lp, old_lp, ref_lp, mask, tis [b, T]; adv, w [b].
    Minimising it raises log pi where the advantage is positive. tis: a constant per-token weight on pg
    (--tis_cap); dual_clip c > 1 (verl's clip_ratio_c) caps pg at -A c for A < 0. -> (loss, stats: weighted
    pg and kl, clipped token count, max |ratio - 1|; all add up over micro-batches and ranks)."""
    ratio = torch.exp(lp - old_lp)  # [b, T]
    a = adv[:, None]  # [b, 1]
    pg = -torch.min(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)  # [b, T]
    if dual_clip > 0:
        pg = torch.where(a < 0, torch.minimum(pg, -a * dual_clip), pg)
    if tis is not None:  # [beyond]
        pg = pg * tis.detach()
    tok = pg
    kl = torch.zeros_like(lp)
    if ref_lp is not None:
        # k3, clamped as verl's low_var_kl: the log-ratio to +-20, the estimate to [-10, 10] (no gradient
        # beyond either clamp) [volcengine/verl verl/trainer/ppo/core_algos.py, kl_penalty_forward; the [-10,
        # 10] clamp also in ZJU-REAL/Agent-G2 verl/trainer/ppo/core_algos.py, kl_penalty]
        d = (ref_lp - lp).clamp(-20.0, 20.0)
        kl = (torch.exp(d) - d - 1).clamp(-10.0, 10.0)  # >= 0
        tok = pg + kl_coef * kl
    W = w[:, None] * mask  # [b, T]
    loss = (tok * W).sum()
    with torch.no_grad():
        clipped = (((ratio - 1).abs() > clip_eps).float() * mask).sum().item()
        dev = ((ratio - 1).abs() * mask).max().item() if mask.any() else 0.0
        stats = {"pg": (pg * W).sum().item(), "kl": (kl * W).sum().item(), "clipped": clipped,
                 "ratio_dev": dev}
    return loss, stats


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


# ---------------------------------------------------------------------------------------------- loss terms
LOGGED = ("pg", "kl", "entropy", "aux", "clipfrac", "ratio_dev")  # in every update's output (0.0 when unused)
# the update's own names: no term stat may take one
RESERVED = {"tokens", "finite", "update_rel", "skipped", "grad_norm", "term_stats", "lp_diff", "lp_k3",
            "lp_tokens", "lp_diff_mean", "lp_diff_max", "lp_kl"}


class Term:
    """A loss term, built once at setup: term(mb) -> (its loss on MicroBatch mb, a tensor; {stat: float}).
    rows: "step" or "aux" (expert-prefix) rows; zero_adv: zero-advantage step rows matter to it (else they get
    no forward); entropy / old: it reads mb.entropy / pi_old; stats: summed over micro-batches and ranks
    (local sum / global count), averaged over mini-batches; maxima: maxed. The loss is this rank's share of
    the global batch's loss (weights from mb.counts, global); the update multiplies it by world (DDP
    averages)."""
    rows, zero_adv, entropy, old, stats, maxima = "step", True, False, False, (), ()

    def __init__(self, cfg):  # a term reads its settings from the config here, once
        pass

    def __call__(self, mb):
        raise NotImplementedError

    def finish(self, sums, maxima, n_mb, tokens):  # the logged values; tokens: all step rows' tokens
        return {**{k: sums[k] / n_mb for k in self.stats}, **{k: maxima[k] for k in self.maxima}}


class PolicyTerm(Term):
    """L_GRPO: policy_loss aggregated by --loss_agg; zero-advantage rows matter only through the KL."""
    stats, maxima, old = ("pg", "kl", "clipped"), ("ratio_dev",), True

    def __init__(self, cfg, with_kl=False):
        self.agg, self.clip_eps, self.dual_clip = cfg.loss_agg, cfg.clip_eps, cfg.dual_clip
        self.kl_coef, self.with_kl, self.zero_adv = cfg.kl_coef, with_kl, with_kl

    def importance(self, old, engine):  # a per-token weight on the pg term (variants/losses.py: TIS), or None
        return None

    def __call__(self, mb):
        eng, old = mb.engine_lp(), mb.old_lp()  # [b, T] each
        return policy_loss(mb.lp, old, mb.adv(), mb.mask, mb.weights(self.agg), self.clip_eps,
                           mb.ref_lp() if self.with_kl else None, self.kl_coef, self.importance(old, eng),
                           self.dual_clip)

    def finish(self, sums, maxima, n_mb, tokens):  # ratio_dev: 0 with one mini-batch, > 0 from the 2nd
        return {"pg": sums["pg"] / n_mb, "kl": sums["kl"] / n_mb,
                "clipfrac": sums["clipped"] / max(tokens, 1), "ratio_dev": maxima["ratio_dev"]}


class AuxTerm(Term):
    """L_aux, teacher forcing on the expert prefix: -sum log pi(a*_t | s_t) / expert tokens (global), times
    eta; logged without eta."""
    rows, stats = "aux", ("aux",)

    def __init__(self, cfg, weight=None):
        self.weight = cfg.eta if weight is None else weight

    def __call__(self, mb):
        w = self.weight
        loss = -(mb.lp * mb.mask).sum() / max(mb.counts["aux_tokens"], 1) * w
        return loss, {"aux": loss.item() / w}  # = local sum / global count


class Entropy(Term):
    """The entropy bonus (verl's entropy_coeff; 0.001 in --preset paper, as the authors' code base):
    -entropy_coef * sum_t w H_t over the step rows (w: --loss_agg's). Logged: the weighted entropy."""
    stats, entropy, zero_adv = ("entropy",), True, True

    def __init__(self, cfg):
        self.coef, self.agg = cfg.entropy_coef, cfg.loss_agg

    def __call__(self, mb):
        W = mb.weights(self.agg)[:, None] * mb.mask  # [b, T]
        h = (mb.entropy * W).sum()
        return -self.coef * h, {"entropy": h.item()}


def needs_reference(cfg):
    """A reference model is loaded only for the term that reads it: the pg term's KL (--kl_coef > 0 under
    --mode grpo); aux_only and the SFT modes have no pg term."""
    return cfg.kl_coef > 0 and cfg.mode == "grpo"


def make_terms(cfg, ref=None):
    """The run's loss terms, chosen once from the config: the paper's L = L_GRPO + eta L_aux (PolicyTerm,
    AuxTerm) with the entropy bonus (Entropy, --entropy_coef > 0), and the variants (variants/losses.py,
    through config.variant): --mode aux_only | sft_*, --tis_cap, --aux_agg prefix-mean, and --loss_terms
    (comma-separated names or module:Class, each built as Class(cfg)). ref: the reference model (None: no
    KL)."""
    from config import variant
    if cfg.mode != "grpo":  # [baseline] no pg term, the aux NLL alone
        terms = [variant("losses", "sft")(cfg)]
    else:
        terms = [variant("losses", "tis")(cfg, ref is not None) if cfg.tis_cap > 0
                 else PolicyTerm(cfg, ref is not None)]
        aux = AuxTerm if cfg.aux_agg == "token-mean" else variant("losses", cfg.aux_agg)
        terms += [aux(cfg)] if cfg.eta > 0 else []
        terms += [Entropy(cfg)] if cfg.entropy_coef > 0 else []
    return terms + [variant("losses", name)(cfg) for name in cfg.loss_terms.split(",") if name]


class MicroBatch:
    """What a term reads of one micro-batch: rows, lp [b, T] (log pi, with gradient, 0 at padding), mask [b,
    T], entropy [b, T] (when asked), counts (the mini-batch's global counts), ep_tok (tokens per episode id),
    and on demand the engine's, pi_old's and the reference's log-probs [b, T], advantages [b], weights [b]."""

    def __init__(self, learn, rows, lp, mask, entropy, counts, ep_tok):
        self.learn, self.rows, self.lp, self.mask, self.entropy = learn, rows, lp, mask, entropy
        self.counts, self.ep_tok, self.device, self.ref_scored = counts, ep_tok, learn.device, None

    def engine_lp(self):  # the engine's log-probs of the sampled tokens
        return self.learn.padded(self.rows, "logprobs", self.lp)

    def old_lp(self):  # pi_old: before this batch's first step (the engine's unless the trainer scored it)
        return self.learn.padded(self.rows, "old_lp", self.lp) if self.learn.old_from_trainer else \
            self.engine_lp()

    def ref_lp(self):  # the reference's (no gradient), or None without one
        if self.ref_scored is None and self.learn.ref is not None:
            with torch.no_grad():
                self.ref_scored = self.learn.token_logprobs(self.learn.ref, self.rows)[0]
        return self.ref_scored

    def adv(self):  # [b]
        return torch.tensor([r["adv"] for r in self.rows], device=self.device)

    def weights(self, agg):
        return agg_weights(agg, torch.tensor([len(r["response_ids"]) for r in self.rows]),
                           torch.tensor([self.ep_tok[r["eid"]] for r in self.rows]), self.counts["tokens"],
                           self.counts["rows"], self.counts["episodes"]).to(self.device)


# ---------------------------------------------------------------------------------------------- the update
def response_logprobs(model, rows, pad_id, device="cpu", temperature=1.0, entropy=False, pack=0):
    """Teacher-forced log-probs of each row's response_ids after its prompt_ids, from the distribution the
    engine sampled (at the temperature; trie-restricted for rows with "allowed"). -> (lp [b, n], mask [b, n]
    (, entropy [b, n])), n the longest response. Only response positions get logits (logits_to_keep: 151,936 x
    2.5k fp32 logits are 1.5 GB a row). pack > 0: rows sharing a prefix share one forward
    (plumbing/packing.py); 0: one left-padded sequence a row."""
    n = max(len(r["response_ids"]) for r in rows)
    # mask, targets: [b, n]
    mask = torch.tensor([[1.0] * len(r["response_ids"]) + [0.0] * (n - len(r["response_ids"])) for r in rows])
    targets = torch.tensor([r["response_ids"] + [pad_id] * (n - len(r["response_ids"])) for r in rows])
    opts = pad_options([trie_options(r["response_ids"], r["allowed"]) if r.get("allowed") else None
                        for r in rows], n) if any(r.get("allowed") for r in rows) else None
    mask, targets = mask.to(device), targets.to(device)
    packs = [p for _, p in pack_rows(rows, pack)] if pack else None
    if packs and len(packs) < len(rows):
        logits = packed_logits(model, rows, packs, n, pad_id, device)  # [b, n, V]
    else:  # prompts left-padded so every response starts at column P; position ids keep RoPE as unpadded
        P = max(len(r["prompt_ids"]) for r in rows)
        input_ids = torch.full((len(rows), P + n), pad_id, dtype=torch.long)  # [b, P + n]
        attention = torch.zeros((len(rows), P + n), dtype=torch.long)
        for b, r in enumerate(rows):
            ids, start = r["prompt_ids"] + r["response_ids"], P - len(r["prompt_ids"])
            input_ids[b, start:start + len(ids)] = torch.tensor(ids)
            attention[b, start:start + len(ids)] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [b, P + n]
        # the logits at column j predict token j + 1: columns P-1 .. P+n-2 score the response (the last n + 1
        # are kept)
        logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                       position_ids=positions.to(device), logits_to_keep=n + 1, use_cache=False).logits[:, :n]
    # logits: [b, n, V]
    opts = None if opts is None else opts.to(device)
    if entropy:  # one fp32 [b, n, V] tensor kept for the backward, as without
        lp, ent = token_logprobs_entropy(logits, targets, opts, temperature)  # [b, n] each
        return lp * mask, mask, ent * mask
    lp = token_logprobs(logits, targets, opts, temperature)  # [b, n]
    return lp * mask, mask


class Update:
    """One batch's update on this rank: pi_old (score_old), one AdamW step a mini-batch (optimizer_step), the
    logged values (summarise). model: what the forward runs (the DDP wrapper, or the policy); policy: whose
    parameters opt owns; terms: the loss terms (make_terms(cfg, ref) when None), which hold every loss
    setting. Every rank runs as many passes as the busiest (zero-loss passes on DUMMY): FSDP all-gathers in
    each pass, DDP reduces in the last."""

    def __init__(self, cfg, model, policy, ref, opt, tok, device, world=1, ddp=False, fsdp=False,
                 prec=contextlib.nullcontext, old_from_trainer=False, terms=None):
        self.cfg, self.model, self.policy, self.ref, self.opt = cfg, model, policy, ref, opt
        self.device, self.world, self.ddp, self.fsdp, self.prec = device, world, ddp, fsdp, prec
        self.old_from_trainer, self.pad_id, self.bad = old_from_trainer, tok.pad_token_id, 0  # bad: see stop
        self.DUMMY = {"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]}
        self.terms = make_terms(cfg, ref) if terms is None else list(terms)
        self.by_rows = {kind: [t for t in self.terms if t.rows == kind] for kind in ("step", "aux")}
        names = [k for t in self.terms for k in (*t.stats, *t.maxima)]
        clash = {k for k in names if names.count(k) > 1} | set(names) & RESERVED
        if clash or len(self.by_rows["step"]) + len(self.by_rows["aux"]) < len(self.terms):
            raise ValueError(f"loss terms: stat names must be unique ({sorted(clash)}), rows step or aux")
        self.zero_adv = any(t.zero_adv for t in self.by_rows["step"])  # else such rows get no forward

    def batch(self, rows, aux):
        """ceil(global rows / --ppo_mini_batch) mini-batches (0: one), cut by mini_batches (the same on 1 GPU
        or 8), each normalised by its own global counts (verl's dp_actor). -> summarise's dict."""
        n_rows = all_sum(len(rows), self.ddp)
        n_mb = max(1, -(-n_rows // self.cfg.ppo_mini_batch)) if self.cfg.ppo_mini_batch else 1
        pairs = list(zip(mini_batches(rows, n_mb), mini_batches(aux, n_mb)))  # (step rows, aux rows) each
        # the terms' stats: summed (maxima: maxed) over mini-batches, then over ranks
        sums = {**{k: 0.0 for t in self.terms for k in t.stats},
                "tokens": float(sum(len(r["response_ids"]) for r in rows))}
        maxima = {k: 0.0 for t in self.terms for k in t.maxima}
        gap = self.score_old([mb for mb, _ in pairs])
        steps = [self.optimizer_step(mb, aux_mb, sums, maxima) for mb, aux_mb in pairs]
        return self.summarise(n_mb, sums, maxima, gap, steps)

    def forward_rows(self, rows):  # zero-advantage rows that no term needs get no forward (they still count)
        return rows if self.zero_adv else [r for r in rows if r["adv"] != 0.0]

    @torch.no_grad()
    def score_old(self, mbs):
        """pi_old by the trainer, every mini-batch before the first step (verl recomputes old_log_prob:
        verl/trainer/ppo/ray_trainer.py), in the loss's micro-batches and by its formula: the ratio is exactly
        1 at the first step. Sets row["old_lp"]. -> the engine-vs-trainer gap: sums lp_diff, lp_k3, lp_tokens;
        lp_diff_max."""
        gap = {"lp_diff": 0.0, "lp_k3": 0.0, "lp_tokens": 0.0, "lp_diff_max": 0.0}
        for rows in mbs if self.old_from_trainer and any(t.old for t in self.terms) else []:
            micro = self.micro_batches(self.forward_rows(rows))
            pad = (all_max(len(micro), self.ddp) - len(micro)) if self.fsdp else 0  # FSDP: as many gathers
            for mb in micro + [[self.DUMMY]] * pad:
                with self.prec():
                    lp, mask = self.token_logprobs(self.model, mb)
                if mb[0] is self.DUMMY:
                    continue
                for b, r in enumerate(mb):
                    r["old_lp"] = lp[b, :len(r["response_ids"])].float().tolist()
                engine_lp = self.padded(mb, "logprobs", lp).float()
                diff, diff_max, k3, n = logprob_mismatch(lp.float(), engine_lp, mask)
                gap.update(lp_diff=gap["lp_diff"] + diff, lp_k3=gap["lp_k3"] + k3,
                           lp_tokens=gap["lp_tokens"] + n, lp_diff_max=max(gap["lp_diff_max"], diff_max))
        return gap

    def optimizer_step(self, mb, aux_mb, sums, maxima):
        """One mini-batch: its global counts, its micro-batches' backward, the clipped step; adds the terms'
        stats to sums and maxima. The gradient norm, so the decision to step, is the same on every rank. ->
        (grad norm, nan for a non-finite loss on any rank: no step; the relative update size, 0 if none)."""
        ep_tok = {}  # response tokens per episode within the mini-batch (the "episode" aggregation)
        for r in mb:
            ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
        counts = reduce_dict({"tokens": sum(ep_tok.values()), "rows": len(mb), "episodes": len(ep_tok),
                              "aux_tokens": sum(len(r["response_ids"]) for r in aux_mb),
                              "aux_weight": sum(1.0 / r["n"] for r in aux_mb)}, self.ddp)
        self.opt.zero_grad(set_to_none=self.fsdp or not self.ddp)  # DDP: grads stay views of its buckets
        stats = self.loss_terms(self.forward_rows(mb), aux_mb, counts, ep_tok)
        finite = all_max(int(stats["finite"] < 1), self.ddp) == 0
        for k in maxima:
            maxima[k] = max(maxima[k], stats[k])
        for k in [k for t in self.terms for k in t.stats]:
            sums[k] += stats[k]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.grad_clip).item() \
            if finite else math.nan
        if not math.isfinite(grad_norm):
            self.opt.zero_grad(set_to_none=True)
            return grad_norm, 0.0
        if grad_norm == 0:  # no signal, no step: Adam would turn a zero gradient into a full-size move
            return grad_norm, 0.0
        self.opt.step()
        return grad_norm, self.update_size()

    def summarise(self, n_mb, sums, maxima, gap, steps):
        """Over ranks: LOGGED (each term's finish), other term stats (named in "term_stats"), update_rel
        (summed), skipped (non-finite mini-batches), grad_norm (mean over the steps taken; nan: none) and,
        when the trainer scored pi_old, the engine-vs-trainer gap (lp_diff_mean, lp_diff_max, lp_kl)."""
        sums = reduce_dict({**sums, **{k: gap[k] for k in ("lp_diff", "lp_k3", "lp_tokens")}}, self.ddp)
        maxima = reduce_dict({**maxima, "lp_diff": gap["lp_diff_max"]}, self.ddp, "max")
        out = dict.fromkeys(LOGGED, 0.0)
        for t in self.terms:
            out.update(t.finish(sums, maxima, n_mb, sums["tokens"]))
        more = [k for k in out if k not in LOGGED]
        norms = [g for g, _ in steps if math.isfinite(g)]
        out.update(update_rel=sum(u for _, u in steps), skipped=len(steps) - len(norms),
                   grad_norm=sum(norms) / len(norms) if norms else math.nan)
        if self.old_from_trainer:  # how far the engine that sampled is from the trainer that scores
            n = max(sums["lp_tokens"], 1)
            out.update(lp_diff_mean=sums["lp_diff"] / n, lp_diff_max=maxima["lp_diff"],
                       lp_kl=sums["lp_k3"] / n)
        return {**out, "term_stats": more} if more else out

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

    def update_size(self):  # ||theta_new - theta_old|| / ||theta_old|| (FSDP: shards summed over ranks)
        sq = reduce_dict(dict(zip(("delta", "theta"), adamw_update_norm(self.opt))), self.fsdp)
        return math.sqrt(sq["delta"] / max(sq["theta"], 1e-30))

    def token_logprobs(self, model, rows, entropy=False):  # response_logprobs under the run's settings
        return response_logprobs(model, rows, self.pad_id, self.device, self.cfg.temperature, entropy,
                                 self.cfg.pack_tokens)

    def micro_batches(self, rows):
        """Up to --micro_batch rows each: whole packs of rows that share prefixes (plumbing/packing.py), or
        rows sorted by length (less padding) where none do or --pack_tokens is 0."""
        mb = self.cfg.micro_batch
        if self.cfg.pack_tokens and (packed := packed_micro_batches(rows, self.cfg.pack_tokens, mb)):
            return packed
        rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
        return [rows[i:i + mb] for i in range(0, len(rows), mb)]

    def padded(self, mb, key, like):  # per-row lists of per-token values -> [b, T], as the log-probs `like`
        out = torch.zeros_like(like)
        for b, r in enumerate(mb):
            out[b, :len(r[key])] = torch.as_tensor(r[key], dtype=out.dtype, device=self.device)
        return out

    def loss_terms(self, rows, aux, counts, ep_tok):
        """Backward, one micro-batch at a time: the step rows' (when a term reads them), the aux rows', then
        zero-loss passes up to the most any rank runs. -> this rank's sums of the terms' stats (maxima as
        maxima) and "finite" (0/1)."""
        stats = {**{k: 0.0 for t in self.terms for k in (*t.stats, *t.maxima)}, "finite": 1.0}
        work = [("step", mb) for mb in (self.micro_batches(rows) if self.by_rows["step"] else [])]
        work += [("aux", mb) for mb in self.micro_batches(aux)] if self.by_rows["aux"] else []
        work += [("none", [self.DUMMY])] * (all_max(max(len(work), 1), self.ddp) - len(work))
        for j, (kind, mb) in enumerate(work):
            # DDP: reduce once, in the last backward
            skip_sync = self.ddp and not self.fsdp and j < len(work) - 1
            with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                with self.prec():  # bf16 compute over the fp32 weights
                    loss = self.micro_loss(kind, mb, counts, ep_tok, stats)
                if not torch.isfinite(loss):  # still backward (every rank joins the same reductions); no step
                    stats["finite"] = 0.0
                loss.backward()
        return stats

    def micro_loss(self, kind, mb, counts, ep_tok, stats):
        """The summed losses of the terms that read `kind` rows (step | aux; none: a zero-loss pass), times
        world (DDP averages gradients over ranks); adds their stats to `stats`."""
        batch = None
        if kind == "none":
            loss = self.token_logprobs(self.model, mb)[0].sum() * 0.0
        else:
            terms = self.by_rows[kind]
            out = self.token_logprobs(self.model, mb, any(t.entropy for t in terms))  # [b, T] each
            batch = MicroBatch(self, mb, out[0], out[1], out[2] if len(out) > 2 else None, counts, ep_tok)
            loss = None
            for t in terms:
                part, got = t(batch)
                loss = part if loss is None else loss + part
                for k in t.stats:
                    stats[k] = stats.get(k, 0.0) + got[k]
                for k in t.maxima:
                    stats[k] = max(stats.get(k, 0.0), got[k])
            loss = loss * self.world
        if self.fsdp and self.ref is not None and (batch is None or batch.ref_scored is None):
            with torch.no_grad():  # the sharded reference all-gathers in every pass, after the policy
                self.token_logprobs(self.ref, [self.DUMMY])
        return loss

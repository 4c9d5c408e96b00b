"""GRPO, whole: the math on tensors (group advantages, trie-restricted log-probs, the aggregations, the
clipped policy loss with the k3 KL), the paper's loss terms as objects, and the pieces train.py's
update_policy runs them with (mini-batches, the counts, a micro-batch's view, the summed loss). It sits
beside train.py as nanoGPT's model.py does; tests/test_grpo.py checks each piece on toy inputs and on the tiny
model.

    adv, n_zero = group_advantages(rewards, gid, keep)            # [E] per episode
    n_zero, n_groups = row_advantages(rows, episodes, "traj")     # the same on train.py's step rows
    est = make_advantage(cfg, tasks); n_zero, n_groups = est(rows, episodes)   # --advantage's estimator
    mbs = mini_batches(rows, n_mb)                                # rank-independent PPO mini-batches
    lp = token_logprobs(logits, targets, options, temperature)    # [b, T] log pi(a_t | s, a_<t)
    w = agg_weights("episode", row_tokens, episode_tokens, n_tokens, n_rows, n_episodes)   # [b]
    loss, stats = policy_loss(lp, old_lp, adv, mask, w, clip_eps, ref_lp, kl_coef)
    terms = make_terms(cfg, ref)        # the loss terms, at setup: PolicyTerm, AuxTerm, Entropy, variants
    loss = terms_loss(terms, MicroBatch(rows, lp, mask, entropy, counts, ep_tok), stats)   # one micro-batch

A loss term (class Term) maps one micro-batch to (its loss, {stat: float}); update_policy sums the active
terms' losses, one backward per micro-batch, and plumbing/lockstep.py sums their stats over micro-batches,
mini-batches and ranks.

Rows are dicts: prompt_ids, response_ids (lists of ints), logprobs (the engine's, one per response token), adv
(the row's advantage), eid (its episode), gid (its group); aux rows instead gid, t (their prefix step), n
(their prefix's length), success (their group's success rate; None: every episode hit an error). A row is one
turn: one prompt and the reply to it (a "sequence" of the aggregations).

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
    seq-mean-token-sum 1 / n_rows; seq-mean-token-mean 1 / (row_tokens n_rows): each row (one turn's reply, a
    "sequence") its token mean, then the mean over rows; episode 1 / (episode_tokens n_episodes) (the CPU
    presets: every episode weighs the same)."""
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


# ---------------------------------------------------------------------------------------------- loss terms
class Term:
    """A loss term, built once at setup: term(mb) -> (its loss on MicroBatch mb, a tensor; {stat: float}).
    rows: "step" or "aux" (expert-prefix) rows; zero_adv: zero-advantage step rows matter to it (else they get
    no forward); entropy / old: it reads mb.entropy / pi_old; stats: summed over micro-batches and ranks
    (local sum / global count), averaged over mini-batches; maxima: maxed. The loss is this rank's share of
    the global batch's loss (weights from mb.counts, global); the rank wrapper multiplies it by world (DDP
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


class MicroBatch:
    """What a term reads of one micro-batch: rows, lp [b, T] (log pi, with gradient, 0 at padding), mask [b,
    T], entropy [b, T] (None unless a term asked), counts (the mini-batch's global counts), ep_tok (tokens per
    episode id); on demand the engine's, pi_old's (old_key: "old_lp" when the trainer scored it, else the
    engine's "logprobs") and the reference's log-probs [b, T] (ref(rows) -> lp; None: no reference),
    advantages [b], weights [b]."""

    def __init__(self, rows, lp, mask, entropy, counts, ep_tok, old_key="logprobs", ref=None):
        self.rows, self.lp, self.mask, self.entropy = rows, lp, mask, entropy
        self.counts, self.ep_tok = counts, ep_tok
        self.old_key, self.ref, self.ref_scored, self.device = old_key, ref, None, lp.device

    def engine_lp(self):  # the engine's log-probs of the sampled tokens
        return padded(self.rows, "logprobs", self.lp)

    def old_lp(self):  # pi_old: before this batch's first step
        return padded(self.rows, self.old_key, self.lp)

    def ref_lp(self):  # the reference's (no gradient), or None without one
        if self.ref_scored is None and self.ref is not None:
            with torch.no_grad():
                self.ref_scored = self.ref(self.rows)
        return self.ref_scored

    def adv(self):  # [b]
        return torch.tensor([r["adv"] for r in self.rows], device=self.device)

    def weights(self, agg):
        return agg_weights(agg, torch.tensor([len(r["response_ids"]) for r in self.rows]),
                           torch.tensor([self.ep_tok[r["eid"]] for r in self.rows]), self.counts["tokens"],
                           self.counts["rows"], self.counts["episodes"]).to(self.device)


def padded(rows, key, like):  # per-row lists of per-token values -> [b, T], as the log-probs `like`
    out = torch.zeros_like(like)
    for b, r in enumerate(rows):
        out[b, :len(r[key])] = torch.as_tensor(r[key], dtype=out.dtype, device=like.device)
    return out


def terms_loss(terms, mb, stats):
    """The summed losses of `terms` on MicroBatch mb their stats added to `stats` (maxima maxed)."""
    loss = None
    for t in terms:
        part, got = t(mb)
        loss = part if loss is None else loss + part
        for k in t.stats:
            stats[k] = stats.get(k, 0.0) + got[k]
        for k in t.maxima:
            stats[k] = max(stats.get(k, 0.0), got[k])
    return loss


def batch_counts(mb, aux_mb):
    """A mini-batch's counts on this rank (the update sums them over ranks): response tokens, rows, episodes
    of the step rows, aux tokens and the aux weights' sum (1/n a row). -> (counts, {eid: response tokens})."""
    ep_tok = {}  # response tokens per episode within the mini-batch (the "episode" aggregation)
    for r in mb:
        ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
    return {"tokens": sum(ep_tok.values()), "rows": len(mb), "episodes": len(ep_tok),
            "aux_tokens": sum(len(r["response_ids"]) for r in aux_mb),
            "aux_weight": sum(1.0 / r["n"] for r in aux_mb)}, ep_tok


def forward_rows(rows, terms):  # zero-advantage rows that no term needs get no forward (they still count)
    needed = any(t.zero_adv for t in terms if t.rows == "step")
    return rows if needed else [r for r in rows if r["adv"] != 0.0]


def micro_batches(rows, cfg):
    """Up to --micro_batch rows each: whole packs of rows that share prefixes (plumbing/packing.py), or
    rows sorted by length (less padding) where none do or --pack_tokens is 0."""
    mb = cfg.micro_batch
    if cfg.pack_tokens and (packed := packed_micro_batches(rows, cfg.pack_tokens, mb)):
        return packed
    rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
    return [rows[i:i + mb] for i in range(0, len(rows), mb)]


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



"""The GRPO math as pure functions on tensors: group advantages, the constrained (trie-masked) log-probs, the
loss weights of each aggregation, and the clipped policy loss with the k3 KL. No model, no environment:
train.py does the micro-batching and the DDP wiring, and tests/test_grpo.py checks each piece on toy inputs.

    adv, n_zero = group_advantages(rewards, gid, keep)            # [E] per episode
    parts = mini_batches(rows, n_mb)                              # rank-independent PPO mini-batches
    n_zero, n_groups = row_advantages(rows, episodes, "traj")     # the same on train.py's step rows
    opts = trie_options(response_ids, allowed)                    # allowed next tokens per response position
    lp = token_logprobs(logits, targets, options, temperature)    # [b, T] log pi(a_t | s, a_<t)
    # [b] per-token weight
    w = agg_weights("episode", row_tokens, episode_tokens, n_tokens, n_rows, n_episodes)
    loss, stats = policy_loss(lp, old_lp, adv, mask, w, clip_eps, ref_lp, kl_coef)
    lr = lr_at(step, lr, steps, warmup_frac, "cosine")            # the optimizer's schedule

Constrained decoding (--constrained 1) samples from the policy restricted to the admissible commands: at each
reply position only the tokens that continue some admissible reply (a token trie) keep their mass,
renormalised. The engines record, and the trainer scores, exactly that distribution. A forced position (one
allowed token) then has log-prob 0 and no gradient, and no mass can drift onto tokens the constraint never
allows.
"""
import math

import torch

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "episode")
FREE = -2  # in an allowed reply: from here on any token (a free-text slot); see trie_options


def group_advantages(rewards, gid, keep=None, eps=1e-6):
    """GRPO advantage: (r - mean_g) / (std_g + eps) within each group g, with the unbiased (n - 1) std, as
    verl's torch.std. [ZJU-REAL/Agent-G2 verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage]
    rewards [E] float, gid [E] long, keep [E] bool (False: an episode that hit an environment error; it leaves
    its group's statistics and gets advantage 0). A group whose kept rewards are all equal gives 0.
    A group with one kept reward gives 0 too, and counts as zero-variance. verl instead sets mean 0, std 1
    there, so the lone reward becomes its own advantage (REINFORCE without a baseline, on the raw reward
    scale: 10 for a win with reward_scale 10, against |adv| of about 1-3 elsewhere). verl meets that only in a
    one-sample group (e.g. rollout.n = 1); here it only happens when errors removed the rest of the group, and
    one outcome carries no relative signal.
    -> (adv [E], number of zero-variance groups among the groups with a kept episode)."""
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
    """group_advantages on the rollout records. rows: step rows {"eid", "gid", "reward"}; episodes: {"eid",
    "gid", "reward", "error"}. level "traj" (paper): one advantage per episode, from episode rewards, given to
    every row of it; "step" (released code): one per row, from row rewards, grouped by gid. Episodes that hit
    an environment error leave their group's statistics. Sets row["adv"]; -> (zero-variance groups, groups
    with a kept unit)."""
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


def mini_batches(rows, n_mb):
    """The batch's rows cut into n_mb mini-batches (one optimizer step each) so that the cut does not depend
    on how the tasks are spread over ranks: each group's rows (one task: its episodes' step rows, in order)
    are split into n_mb near-equal consecutive blocks, and mini-batch j takes block j of every group. A
    process holding every group and ranks holding some each therefore form the same global mini-batches, and
    each rank's parts are near-equal. n_mb comes from the global row count: ceil(rows over all ranks /
    --ppo_mini_batch). rows: dicts with "gid" -> n_mb lists (some may be empty)."""
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
    """Learning rate at a step: linear warm-up over max(1, warmup_frac * steps) steps, then cosine to 0 at
    `steps` (or constant)."""
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
    query).
    -> list (len(response)) of sorted lists, or None where a free slot is open (the whole vocabulary); an
    empty list means the prefix left the trie (never for a reply the constrained engine produced)."""
    out, alive, free = [], list(allowed), False
    for j, t in enumerate(response):
        free = free or any(len(s) > j and s[j] == FREE for s in alive)  # once in a free slot, to the end
        if free:
            out.append(None)
            continue
        out.append(sorted({s[j] for s in alive if len(s) > j}))
        alive = [s for s in alive if len(s) > j and s[j] == t]
    return out


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
    """log pi(target_t) under softmax(logits / temperature), restricted where options say so.
    logits [b, T, V] float, targets [b, T] long, options [b, T, K] long (-1 = pad; a position whose K entries
    are all -1 is unconstrained). -> [b, T]. Memory is O(b T K) beyond the logits, so a 150k vocabulary is
    fine."""
    z = logits.float() / (temperature if temperature > 0 else 1.0)  # T = 0 (greedy): score the T = 1 policy
    tgt = z.gather(-1, targets[..., None])[..., 0]  # [b, T]
    lse_all = torch.logsumexp(z, -1)  # [b, T]
    if options is None:
        return tgt - lse_all
    constrained = (options >= 0).any(-1)  # [b, T]
    opt = z.gather(-1, options.clamp(min=0)).masked_fill(options < 0, float("-inf"))  # [b, T, K]
    lse_opt = torch.logsumexp(opt, -1)  # [b, T]
    return tgt - torch.where(constrained, lse_opt, lse_all)


class _EntropyOfLogp(torch.autograd.Function):
    """H = -sum_v p_v log p_v from log-probabilities logp [..., V] -> [...]. Autograd keeps only logp, which
    the log_softmax before it keeps anyway; p is recomputed in the backward: dH/dlogp_v = -p_v (logp_v +
    1)."""

    @staticmethod
    def forward(ctx, logp):
        ctx.save_for_backward(logp)
        return -(logp.exp() * logp).sum(-1)

    @staticmethod
    def backward(ctx, grad_h):
        (logp,) = ctx.saved_tensors
        return -grad_h[..., None] * logp.exp() * (logp + 1)


def token_logprobs_entropy(logits, targets, options=None, temperature=1.0):
    """token_logprobs, and the entropy of the distribution that is sampled at each position (softmax(logits /
    T), restricted and renormalised where options say so), from one log_softmax (the entropy bonus of the GPU
    presets). Apart from the model's own activations, autograd keeps one [b, T, V] fp32 tensor, the
    log-probabilities, as token_logprobs alone does; the separate paths would keep three (a scaled copy, the
    softmax, the entropy's copy). logits [b, T, V], targets [b, T], options [b, T, K] (as token_logprobs) ->
    (lp [b, T], H [b, T])."""
    z = logits.float() / (temperature if temperature > 0 else 1.0)  # freed after the log_softmax: not saved
    logp = torch.log_softmax(z, -1)  # [b, T, V]
    lp = logp.gather(-1, targets[..., None])[..., 0]  # [b, T]
    h = _EntropyOfLogp.apply(logp)  # [b, T]
    if options is None:
        return lp, h
    constrained = (options >= 0).any(-1)  # [b, T]
    opt = logp.gather(-1, options.clamp(min=0)).masked_fill(options < 0, float("-inf"))  # [b, T, K]
    q_log = opt - torch.logsumexp(opt, -1, keepdim=True)  # log-probs renormalised over the allowed tokens
    lp_opt = lp - torch.logsumexp(opt, -1)
    h_opt = -(q_log.exp() * q_log.masked_fill(options < 0, 0.0)).sum(-1)
    return torch.where(constrained, lp_opt, lp), torch.where(constrained, h_opt, h)


def step_rewards(won, invalid, reward_scale, invalid_penalty, level):
    """Reward of each step row of one episode. won: bool; invalid: [n] bools, one per policy step.
    traj (paper): every row gets the episode's reward, reward_scale * won - invalid_penalty * (number
    invalid); step (released code): each row gets reward_scale * won - invalid_penalty * [this step was
    invalid] (verl-agent's per-step invalid-action penalty). -> [n] floats."""
    if level == "traj":
        return [reward_scale * float(won) - invalid_penalty * sum(invalid)] * len(invalid)
    if level == "step":  # [released]
        return [reward_scale * float(won) - invalid_penalty * float(b) for b in invalid]
    raise ValueError(f"unknown advantage level {level!r} (expected traj or step)")


def agg_weights(agg, row_tokens, episode_tokens, n_tokens, n_rows, n_episodes):
    """Weight of each token of each row so that loss = sum_rows w_row * sum_t tok_loss_t is the aggregation's
    mean. row_tokens [b]: response tokens of the row; episode_tokens [b]: response tokens of the row's whole
    episode; n_tokens / n_rows / n_episodes: global counts (all ranks) of the batch being aggregated.
      token-mean           1 / n_tokens                       every token weighs the same (long episodes
                                                              weigh more): verl's default, the GPU presets
      seq-mean-token-sum   1 / n_rows                         every step row's token sum weighs the same
      seq-mean-token-mean  1 / (row_tokens * n_rows)          every step row weighs the same
      episode              1 / (episode_tokens * n_episodes)  every episode weighs the same (mean over its
                                                              tokens): the CPU presets
    -> [b] float."""
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


def policy_loss(lp, old_lp, adv, mask, w, clip_eps, ref_lp=None, kl_coef=0.0, tis=None, dual_clip=0.0,
                entropy=None, entropy_coef=0.0):
    """Clipped GRPO surrogate + k3 KL to the reference, aggregated with per-row token weights.
    lp, old_lp, ref_lp, mask [b, T]; adv, w [b]. The sign: minimising this raises log pi of tokens with
    positive advantage. -> (loss, stats) with stats = weighted pg and kl terms, clip fraction and max |ratio -
    1| (pg, kl: weighted like the loss; clipped: a token count; all add up over micro-batches and ranks).
    tis [b, T] (beyond the paper, --tis_cap): a truncated importance weight min(pi_old / pi_engine, C) on the
      pg term, for the mismatch between the engine that sampled and the trainer that scores (constant, no
      gradient).
    dual_clip c > 1 (verl's clip_ratio_c): for a negative advantage the pg term is capped at -A * c, so a
      token whose ratio has run far past 1 + eps cannot dominate the loss. 0 = off.
    entropy [b, T] (token_logprobs_entropy) with entropy_coef: - coef * H per token, aggregated like the pg
      term (verl's entropy_coeff): minimising the loss raises the entropy."""
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
    ent = torch.zeros_like(lp) if entropy is None else entropy
    tok = tok - entropy_coef * ent
    W = w[:, None] * mask  # [b, T]
    loss = (tok * W).sum()
    with torch.no_grad():
        clipped = (((ratio - 1).abs() > clip_eps).float() * mask).sum().item()
        dev = ((ratio - 1).abs() * mask).max().item() if mask.any() else 0.0
        stats = {"pg": (pg * W).sum().item(), "kl": (kl * W).sum().item(), "entropy": (ent * W).sum().item(),
                 "clipped": clipped, "ratio_dev": dev}
    return loss, stats


def tis_weights(old_lp, engine_lp, cap):
    """Truncated importance sampling weights min(pi_old / pi_engine, cap) per token ([b, T] each), as verl's
    tis_imp_ratio_cap (verl/trainer/ppo/core_algos.py): old_lp from the trainer, engine_lp as the engine
    sampled."""
    return torch.exp(old_lp - engine_lp).clamp(max=cap)


def logprob_mismatch(old_lp, engine_lp, mask):
    """Engine vs trainer on the sampled tokens ([b, T] each): mean and max |delta log p| and the k3 estimate
    of
    KL(engine || trainer) (the tokens are the engine's samples). -> (sum |d|, max |d|, sum k3, token count),
    sums so they add over micro-batches and ranks."""
    d = (old_lp - engine_lp) * mask  # [b, T]
    k3 = (torch.exp(d) - d - 1) * mask
    return (d.abs().sum().item(), d.abs().max().item() if mask.any() else 0.0, k3.sum().item(),
            mask.sum().item())


def adamw_update_norm(opt, chunk=1 << 22):
    """||theta_new - theta_old||^2 and ||theta_old||^2 of the step torch.optim.AdamW just took, from its
    state, without a copy of the weights (a copy is 6 GB at 1.5B in fp32). torch's AdamW (torch/optim/adam.py,
    decoupled weight decay) does  p <- p (1 - lr wd) - u,  u = lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),
    so  p_old = (p_new + u) / (1 - lr wd)  and  delta = -(lr wd p_new + u) / (1 - lr wd): no cancellation, so
    fp32 is exact enough; sums in fp64. Works through `chunk` elements at a time (temporaries of 16 MB, not of
    a whole 151,936 x 1,536 embedding). Only parameters that had a gradient moved. FSDP2 shards (DTensor)
    count their local part. -> (float, float)"""
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

"""grpo.py on toy tensors: the sign of the update, the trie mask, every loss aggregation, zero-variance groups,
error episodes, clipping and the KL term (no model, no environment); then the update (train.py's update_policy) and its
loss terms (grpo.PolicyTerm, AuxTerm, variants/losses.py, README's own term) on the tiny model and a fixed batch."""
import math

import pytest
import torch

from grpo import (FREE, agg_weights, group_advantages, lr_at, pad_options, policy_loss, row_advantages,
                  token_logprobs, trie_options)
from plumbing.lockstep import adamw_update_norm, logprob_mismatch


def test_group_advantages_sign_and_zero_variance():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    adv, n_zero = group_advantages(r, gid)
    # group 0: mean 0.25; squared deviations 0.5625 + 3 * 0.0625 = 0.75; unbiased (verl's torch.std) variance
    # 0.75 / (4 - 1) = 0.25 -> std 0.5 -> advantages 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5
    assert adv[:4].tolist() == pytest.approx([0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3)
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert adv[0] > 0 > adv[1]  # the winner is pushed up, the losers down
    assert adv[4:].tolist() == [0.0] * 4  # all-1 and all-0 groups carry no signal
    assert n_zero == 2
    assert adv[:4].sum().item() == pytest.approx(0.0, abs=1e-6)  # advantages of a group sum to zero


def test_error_episodes_leave_their_group():
    r = torch.tensor([1.0, 0.0, 0.0])
    gid = torch.tensor([0, 0, 0])
    adv, n_zero = group_advantages(r, gid, keep=torch.tensor([True, True, False]))
    assert adv[2].item() == 0.0  # the error episode trains on nothing
    # kept [1, 0]: mean 0.5, unbiased variance (0.25 + 0.25) / 1 = 0.5 -> std 1/sqrt(2) -> +-0.5 * sqrt(2) = +-0.7071
    assert adv[:2].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    adv, n_zero = group_advantages(torch.tensor([1.0, 1.0, 0.0]), gid, keep=torch.tensor([True, True, False]))
    assert adv.tolist() == [0.0, 0.0, 0.0] and n_zero == 1  # without the error episode the group is all-1


def test_one_element_group_gets_zero():
    # group 0 keeps only its reward 10.0 (its other episode errored); verl would give 10 / (1 + 1e-6) there (mean 0,
    # std 1 for a one-sample group); we give 0 and count it as a zero-variance group. Group 1: [1, 0] as above.
    adv, n_zero = group_advantages(torch.tensor([10.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]),
                                   keep=torch.tensor([True, False, True, True]))
    assert adv[:2].tolist() == [0.0, 0.0] and n_zero == 1
    assert adv[2:].tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)], abs=1e-4)
    assert torch.isfinite(adv).all()


def test_row_advantages_traj_and_step_levels():
    # group 0: episode 1 won in 2 step rows, episode 2 lost in 3; group 1: episode 3 won, episode 4 hit an env
    # error; group 2: its only episode (5) errored, so it is not counted as a group at all
    eps = [{"eid": 1, "gid": 0, "reward": 1.0, "error": False}, {"eid": 2, "gid": 0, "reward": 0.0, "error": False},
           {"eid": 3, "gid": 1, "reward": 1.0, "error": False}, {"eid": 4, "gid": 1, "reward": 0.0, "error": True},
           {"eid": 5, "gid": 2, "reward": 1.0, "error": True}]
    rows = [{"eid": e, "gid": g, "reward": rw} for e, g, rw in
            [(1, 0, 1.0), (1, 0, 1.0), (2, 0, 0.0), (2, 0, 0.0), (2, 0, 0.0), (3, 1, 1.0), (4, 1, 0.0), (5, 2, 1.0)]]
    n_zero, n_groups = row_advantages(rows, eps, "traj")
    # trajectory level: every row of an episode carries that episode's advantage, whatever its length; group 0's
    # episodes [1, 0]: unbiased std 1/sqrt(2) -> +-0.5 * sqrt(2) = +-0.7071
    h = math.sqrt(0.5)
    assert [r["adv"] for r in rows[:5]] == pytest.approx([h] * 2 + [-h] * 3, abs=1e-4)
    # group 1 without its error episode is all-1: no signal, and the error episode's row gets 0 too
    assert rows[5]["adv"] == rows[6]["adv"] == rows[7]["adv"] == 0.0 and (n_zero, n_groups) == (1, 2)
    # step level (released code): rows are the units; group 0 has 2 winning rows of 5: mean 0.4, squared
    # deviations 2 * 0.36 + 3 * 0.16 = 1.2, unbiased variance 1.2 / 4 = 0.3; group 1 keeps one row (eid 4 errored)
    n_zero, n_groups = row_advantages(rows, eps, "step")
    sd = math.sqrt(0.3)
    assert [r["adv"] for r in rows[:5]] == pytest.approx([0.6 / (sd + 1e-6)] * 2 + [-0.4 / (sd + 1e-6)] * 3)
    assert [r["adv"] for r in rows[:5]] == pytest.approx([1.0954] * 2 + [-0.7303] * 3, abs=1e-4)
    assert (n_zero, n_groups) == (1, 2)
    with pytest.raises(ValueError, match="advantage level"):
        row_advantages(rows, eps, "token")


def test_lr_at_warmup_then_cosine():
    lrs = [lr_at(s, 1.0, 100, 0.05, "cosine") for s in range(100)]
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # 5 warm-up steps reach the peak
    assert lrs[5] == pytest.approx(1.0) and all(a >= b for a, b in zip(lrs[5:], lrs[6:]))  # then only down
    assert lrs[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 94 / 95)))  # near 0 on the last step
    assert lr_at(50, 1.0, 100, 0.05, "constant") == 1.0
    assert lr_at(0, 1.0, 10, 0.0, "cosine") == 1.0  # no warm-up asked: still at least one step, at the peak
    with pytest.raises(ValueError, match="lr schedule"):
        lr_at(0, 1.0, 10, 0.1, "linear")


def test_trie_options_forced_and_branching_positions():
    # replies: "<a> go x 1 </a> EOS" as tokens 10 20 30 1 11 9 / 10 20 30 2 11 9 / 10 40 11 9
    allowed = [[10, 20, 30, 1, 11, 9], [10, 20, 30, 2, 11, 9], [10, 40, 11, 9]]
    assert trie_options([10, 20, 30, 2, 11, 9], allowed) == [[10], [20, 40], [30], [1, 2], [11], [9]]
    assert trie_options([10, 40, 11, 9], allowed) == [[10], [20, 40], [11], [9]]
    assert trie_options([10, 99], allowed)[1] == [20, 40] and trie_options([10, 99, 5], allowed)[2] == []


def test_free_text_slot_opens_the_whole_vocabulary_after_its_literal_start():
    # "<a> click x </a> EOS" = 10 20 30 11 9 ; "<a> search[" = 10 50, then a free query (WebShop's search)
    allowed = [[10, 20, 30, 11, 9], [10, 50, FREE]]
    assert trie_options([10, 50, 7, 8, 11, 9], allowed) == [[10], [20, 50], None, None, None, None]
    assert trie_options([10, 20, 30, 11, 9], allowed) == [[10], [20, 50], [30], [11], [9]]
    torch.manual_seed(0)
    logits, targets = torch.randn(1, 4, 60), torch.tensor([[10, 50, 7, 9]])
    opts = pad_options([trie_options([10, 50, 7, 9], allowed)], 4)
    lp = token_logprobs(logits, targets, opts)
    full = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert lp[0, 0].item() == pytest.approx(0.0, abs=1e-6)  # forced "<a>"
    assert torch.allclose(lp[0, 2:], full[0, 2:])  # inside the slot: the plain policy, EOS included


def test_constrained_logprobs_are_the_renormalised_policy():
    torch.manual_seed(0)
    V = 50
    logits = torch.randn(1, 3, V)
    targets = torch.tensor([[7, 3, 9]])
    opts = pad_options([[[7], [3, 4, 5], [9, 11]]], 3)  # forced, 3-way, 2-way
    lp = token_logprobs(logits, targets, opts)
    assert lp[0, 0].item() == pytest.approx(0.0, abs=1e-6)  # a forced token has probability 1
    p = torch.softmax(logits[0, 1, [3, 4, 5]], -1)[0]
    assert lp[0, 1].item() == pytest.approx(math.log(p.item()), abs=1e-5)
    full = token_logprobs(logits, targets)  # unconstrained = plain log-softmax
    assert torch.allclose(full, torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0])
    assert (lp >= full - 1e-6).all()  # restricting can only raise a kept token's probability
    # temperature: the sampled distribution softmax(z / T)
    lp_t = token_logprobs(logits, targets, opts, temperature=0.5)
    p = torch.softmax(logits[0, 1, [3, 4, 5]] / 0.5, -1)[0]
    assert lp_t[0, 1].item() == pytest.approx(math.log(p.item()), abs=1e-5)
    # an unconstrained row next to a constrained one in the same batch
    two = token_logprobs(logits.repeat(2, 1, 1), targets.repeat(2, 1), pad_options([[[7], [3, 4, 5], [9, 11]], None], 3))
    assert torch.allclose(two[0], lp[0]) and torch.allclose(two[1], full[0])


def test_forced_tokens_get_no_gradient_and_mass_cannot_leave_the_trie():
    logits = torch.randn(1, 2, 20, requires_grad=True)
    opts = pad_options([[[4], [5, 6]]], 2)
    lp = token_logprobs(logits, torch.tensor([[4, 6]]), opts)
    (-lp.sum()).backward()
    assert logits.grad[0, 0].abs().max().item() == 0.0  # forced position: no gradient at all
    g = logits.grad[0, 1]
    assert g[[0, 1, 2, 3, 7, 8]].abs().max().item() == 0.0  # tokens outside the trie are never touched
    assert g[6] < 0 < g[5]  # descending the loss raises the chosen token against its sibling only


def test_agg_weights_each_aggregation():
    # 3 rows: episode A has rows of 2 and 4 tokens, episode B one row of 6 tokens
    row_tok = torch.tensor([2, 4, 6])
    ep_tok = torch.tensor([6, 6, 6])
    n_tok, n_rows, n_eps = 12, 3, 2
    tm = agg_weights("token-mean", row_tok, ep_tok, n_tok, n_rows, n_eps)
    assert (tm * row_tok).sum().item() == pytest.approx(1.0)  # a mean over all tokens
    st = agg_weights("seq-mean-token-sum", row_tok, ep_tok, n_tok, n_rows, n_eps)
    assert st.tolist() == pytest.approx([1 / 3] * 3)
    sm = agg_weights("seq-mean-token-mean", row_tok, ep_tok, n_tok, n_rows, n_eps)
    assert (sm * row_tok).tolist() == pytest.approx([1 / 3] * 3)  # every row weighs the same
    ep = agg_weights("episode", row_tok, torch.tensor([6, 6, 6]), n_tok, n_rows, n_eps)
    assert ((ep * row_tok)[:2].sum().item(), (ep * row_tok)[2].item()) == pytest.approx((0.5, 0.5))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_weights("sum", row_tok, ep_tok, n_tok, n_rows, n_eps)


def test_length_bias_token_mean_vs_episode():
    """A group with one winner (3 turns of 4 tokens) and one loser (10 turns of 4 tokens): the advantages sum to
    zero, but token-mean gives the loser's tokens 10/13 of the weight, so the net push at ratio 1 lowers what the
    policy did. Per-episode weighting is neutral."""
    adv_ep = torch.tensor([1.0, -1.0])
    turns = [3, 10]
    adv = torch.cat([adv_ep[i].repeat(turns[i]) for i in range(2)])  # [13] one entry per row
    row_tok = torch.full((13,), 4)
    ep_tok = torch.cat([torch.full((t,), 4 * t) for t in turns])
    lp = torch.zeros(13, 4)
    mask = torch.ones(13, 4)
    net = {}
    for agg in ("token-mean", "episode"):
        w = agg_weights(agg, row_tok, ep_tok, 52, 13, 2)
        loss, st = policy_loss(lp, lp, adv, mask, w, 0.2)
        net[agg] = st["pg"]  # = -sum_t w_t A_t at ratio 1
    assert net["token-mean"] == pytest.approx(7 / 13)  # positive pg term: a net push down
    assert net["episode"] == pytest.approx(0.0, abs=1e-7)


def test_policy_loss_sign_clip_and_kl():
    lp = torch.zeros(2, 3, requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    w = torch.tensor([0.1, 0.1])
    loss, st = policy_loss(lp, old, adv, mask, w, 0.2)
    loss.backward()
    assert st["clipped"] == 0 and st["ratio_dev"] == 0.0  # on-policy: ratio exactly 1
    # descending the loss raises log-probs of the winner's tokens and lowers the loser's; padding gets nothing
    assert (lp.grad[0, :2] < 0).all() and (lp.grad[1] > 0).all() and lp.grad[0, 2] == 0
    assert lp.grad[0, 0].item() == pytest.approx(-0.1)
    # outside the clip range in the direction of the advantage: clipped, no gradient
    lp2 = torch.full((1, 2), math.log(1.5), requires_grad=True)
    loss, st = policy_loss(lp2, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), torch.tensor([1.0]), 0.2)
    loss.backward()
    assert st["clipped"] == 2 and lp2.grad.abs().max().item() == 0.0
    assert st["ratio_dev"] == pytest.approx(0.5)
    # k3 KL: zero with zero gradient at the reference, positive and pulling back elsewhere
    lp3 = torch.zeros(1, 2, requires_grad=True)
    loss, st = policy_loss(lp3, lp3.detach(), torch.tensor([0.0]), torch.ones(1, 2), torch.tensor([1.0]), 0.2,
                           ref_lp=torch.zeros(1, 2), kl_coef=0.5)
    loss.backward()
    assert st["kl"] == 0.0 and lp3.grad.abs().max().item() == 0.0
    lp4 = torch.full((1, 1), -0.5, requires_grad=True)
    loss, st = policy_loss(lp4, lp4.detach(), torch.tensor([0.0]), torch.ones(1, 1), torch.tensor([1.0]), 0.2,
                           ref_lp=torch.zeros(1, 1), kl_coef=1.0)
    loss.backward()
    assert st["kl"] > 0 and lp4.grad.item() < 0  # descending raises lp back towards the reference


def test_zero_advantage_gives_zero_gradient():
    lp = torch.randn(3, 4, requires_grad=True)
    loss, _ = policy_loss(lp, lp.detach(), torch.zeros(3), torch.ones(3, 4), torch.full((3,), 0.1), 0.2)
    loss.backward()
    assert lp.grad.abs().max().item() == 0.0


def test_policy_loss_dual_clip_caps_negative_advantage_tokens():
    """dual_clip c caps the pg term of a negative-advantage token at -A * c; positive advantages are untouched."""
    # ratio 5 (lp - old = log 5) and ratio 1; row 0 has A = -1, row 1 A = +1; clip_eps 0.2, every weight 1
    lp0 = torch.tensor([[math.log(5.0), 0.0], [math.log(5.0), 0.0]])
    old, mask, w = torch.zeros(2, 2), torch.ones(2, 2), torch.ones(2)
    adv = torch.tensor([-1.0, 1.0])
    res = {}
    for c in (0.0, 3.0):
        lp = lp0.clone().requires_grad_()
        loss, st = policy_loss(lp, old, adv, mask, w, 0.2, dual_clip=c)
        loss.backward()
        res[c] = (loss.item(), st, lp.grad)
    # A = -1, ratio 5: -min(5 * -1, 1.2 * -1) = -(-5) = 5; with c = 3: min(5, -(-1) * 3) = 3
    # A = -1, ratio 1: -min(-1, -1) = 1 (below the cap 3 either way)
    # A = +1, ratio 5: -min(5, 1.2) = -1.2;  A = +1, ratio 1: -1
    # without dual clip: 5 + 1 - 1.2 - 1 = 3.8; with c = 3: 3 + 1 - 1.2 - 1 = 1.8
    assert res[0.0][0] == pytest.approx(3.8) and res[0.0][1]["pg"] == pytest.approx(3.8)
    assert res[3.0][0] == pytest.approx(1.8) and res[3.0][1]["pg"] == pytest.approx(1.8)
    # d/dlp of the uncapped term 5 = -A * exp(lp) is exp(log 5) = 5; the capped term is the constant 3: gradient 0
    assert res[0.0][2][0, 0].item() == pytest.approx(5.0) and res[3.0][2][0, 0].item() == 0.0
    # the positive-advantage row alone (w = [0, 1]): -1.2 - 1 = -2.2 with and without dual clip
    for c in (0.0, 3.0):
        loss, _ = policy_loss(lp0, old, adv, mask, torch.tensor([0.0, 1.0]), 0.2, dual_clip=c)
        assert loss.item() == pytest.approx(-2.2)
    # the clip statistics are the ratio's: |5 - 1| = 4 > 0.2 on two tokens, max |ratio - 1| = 4
    assert res[3.0][1]["clipped"] == 2 and res[3.0][1]["ratio_dev"] == pytest.approx(4.0)


def test_policy_loss_tis_weights_pg_without_gradient_and_leaves_ratio_stats():
    """tis multiplies the per-token pg term, gets no gradient itself, and clip stats still come from the ratio."""
    # A = +1; token 0 has ratio 1.5 (clipped: pg = -min(1.5, 1.2) = -1.2), token 1 ratio 1 (pg = -1)
    lp = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    tis = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss, st = policy_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), torch.tensor([1.0]), 0.2,
                           tis=tis)
    loss.backward()
    # weighted: -1.2 * 0.5 + -1 * 2.0 = -0.6 - 2.0 = -2.6 (unweighted it would be -2.2)
    assert loss.item() == pytest.approx(-2.6) and st["pg"] == pytest.approx(-2.6)
    # token 0 is clipped (no gradient); token 1: d/dlp (-exp(lp) * 2.0) at lp = 0 is -2.0
    assert lp.grad[0].tolist() == pytest.approx([0.0, -2.0])
    assert tis.grad is None  # a constant weight: nothing flows into it
    # stats from the ratio alone: |1.5 - 1| = 0.5 > 0.2 on one token (ratio * tis would give 0.75 and 2.0)
    assert st["clipped"] == 1 and st["ratio_dev"] == pytest.approx(0.5)


def test_tis_weights_truncated_ratio_old_over_engine():
    """tis_weights = exp(old - engine) capped at cap (pi_old / pi_engine, not the inverse)."""
    from variants.losses import tis_weights
    old = torch.tensor([[math.log(2.0) - 1.0, math.log(0.5) + 0.3, -0.3]])
    engine = torch.tensor([[-1.0, 0.3, -0.3]])
    # old - engine = log 2, log 0.5, 0 -> ratios 2 (capped to 1.5), 0.5, 1
    assert tis_weights(old, engine, 1.5)[0].tolist() == pytest.approx([1.5, 0.5, 1.0])
    # a cap above every ratio leaves them: 2, 0.5, 1
    assert tis_weights(old, engine, 10.0)[0].tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_logprob_mismatch_sums_over_masked_tokens():
    """logprob_mismatch -> (sum |d|, max |d|, sum k3, count) with d = old - engine, masked positions ignored."""
    old = torch.tensor([[-0.9, 0.3, 50.0], [-2.0, 40.0, 0.0]])
    engine = torch.tensor([[-1.0, 0.5, 0.0], [-2.0, 0.0, -30.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    s_abs, m_abs, s_k3, n = logprob_mismatch(old, engine, mask)
    # kept d = 0.1, -0.2, 0 (the 50, 40 and 30 sit at masked positions)
    # sum |d| = 0.3, max |d| = 0.2, count 3
    # k3 = exp(d) - d - 1: exp(0.1) - 1.1 = 1.1051709 - 1.1 = 0.0051709; exp(-0.2) - 0.8 = 0.8187308 - 0.8
    # = 0.0187308; d = 0 gives 0 -> sum 0.0239017  (with d = engine - old it would be 0.0048374 + 0.0214028
    # = 0.0262402)
    assert s_abs == pytest.approx(0.3, abs=1e-6) and m_abs == pytest.approx(0.2, abs=1e-6) and n == 3
    assert s_k3 == pytest.approx(0.0239017, abs=1e-6)
    assert logprob_mismatch(old, engine, torch.zeros(2, 3)) == (0.0, 0.0, 0.0, 0.0)  # nothing kept


def _adamw_step_reference(opt, params):
    """One opt.step(); -> (||p_new - p_old||^2, ||p_old||^2) over the parameters with a gradient, from clones."""
    moved = [p for p in params if p.grad is not None]
    before = [p.detach().double().clone() for p in moved]
    opt.step()
    d2 = sum(((p.detach().double() - b) ** 2).sum().item() for p, b in zip(moved, before))
    return d2, sum((b ** 2).sum().item() for b in before)


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-6), (torch.float32, 1e-5)])  # fp32: train.py's weights
def test_adamw_update_norm_matches_a_copy_of_the_weights(dtype, rel):
    """adamw_update_norm equals the clone-and-difference update size: steps 1 and 2, with/without wd, in chunks."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(2, 3, dtype=dtype))  # group with weight decay 0.01
    b = torch.nn.Parameter(torch.randn(4, dtype=dtype))  # same group; no gradient at step 2
    c = torch.nn.Parameter(torch.randn(3, dtype=dtype))  # group without weight decay
    never = torch.nn.Parameter(torch.ones(5, dtype=dtype))  # never gets a gradient
    opt = torch.optim.AdamW([{"params": [a, b], "weight_decay": 0.01}, {"params": [c, never], "weight_decay": 0.0}],
                            lr=0.1)
    params = [a, b, c, never]
    for step, uses in ((1, (a, b, c)), (2, (a, c))):  # step 2: b.grad is None but b has AdamW state from step 1
        opt.zero_grad(set_to_none=True)
        sum(((p - 0.3 * step) ** 3).sum() for p in uses).backward()
        ref = _adamw_step_reference(opt, params)
        for chunk in (1 << 22, 4):  # chunk 4: a's 6 elements go in two pieces (4 + 2), b's 4 in one, c's 3 in one
            got = adamw_update_norm(opt, chunk=chunk)
            assert got[0] == pytest.approx(ref[0], rel=rel) and got[1] == pytest.approx(ref[1], rel=rel), (step, chunk)
        assert ref[0] > 0


@pytest.mark.parametrize("wd, delta2", [(0.0, 0.01), (0.01, 0.010201)])
def test_adamw_update_norm_first_step_by_hand(wd, delta2):
    """First AdamW step on a scalar p = 1, g = 2, lr 0.1: delta = -(lr + lr wd p), ||theta_old||^2 = 1."""
    # m = 0.1 * 2 = 0.2, v = 0.001 * 4 = 0.004; m_hat = 0.2 / 0.1 = 2, v_hat = 0.004 / 0.001 = 4 -> u = 0.1 * 2 / 2
    # = 0.1 (eps 1e-8 is negligible); wd 0: p = 1 - 0.1 = 0.9, delta^2 = 0.01; wd 0.01: p = 1 * (1 - 0.1 * 0.01)
    # - 0.1 = 0.899, delta = -0.101, delta^2 = 0.010201
    p = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    (2.0 * p).backward()  # grad 2
    opt.step()
    assert p.item() == pytest.approx(1.0 - math.sqrt(delta2), rel=1e-6)
    d2, o2 = adamw_update_norm(opt)
    assert d2 == pytest.approx(delta2, rel=1e-6) and o2 == pytest.approx(1.0, rel=1e-6)


def test_row_rewards_traj_vs_step_level():
    """rollout.Reward's row rewards. traj: every row gets the episode's reward; step (released code): each row
    its own invalid penalty."""
    from types import SimpleNamespace
    from config import get_config
    from rollout import Episode, Reward

    def rule(level):  # (won, a bool per row: invalid) -> the rows' rewards of such a finished episode
        reward = Reward(SimpleNamespace(reward_scale=10.0, invalid_penalty=0.1, adv_level=level))
        def rows(won, invalid):
            ep = Episode(0, 0, {}, 0, [], [], "", won=won, invalid=sum(invalid), rows=[{"valid": not b} for b in invalid])
            return reward.rows(ep, reward.episode(ep))
        return rows
    # a won episode of 3 steps, the middle one invalid; reward 10 * won - 0.1 * invalid
    # traj: 10 - 0.1 * 1 = 9.9 on every row; step: 10, 10 - 0.1 = 9.9, 10
    assert rule("traj")(True, [False, True, False]) == pytest.approx([9.9, 9.9, 9.9])
    assert rule("step")(True, [False, True, False]) == pytest.approx([10.0, 9.9, 10.0])
    # a lost episode with two invalid steps of two: traj -0.2 each, step -0.1 each
    assert rule("traj")(False, [True, True]) == pytest.approx([-0.2, -0.2])
    assert rule("step")(False, [True, True]) == pytest.approx([-0.1, -0.1])
    with pytest.raises(SystemExit):  # an unknown level: a one-line error at start-up
        get_config(["--adv_level", "episode"])


def token_entropy(logits, options=None):
    from grpo import token_logprobs_entropy
    return token_logprobs_entropy(logits, torch.zeros(logits.shape[:2], dtype=torch.long), options)[1]


def test_token_entropy_full_and_restricted():
    """Entropy of the sampled distribution: uniform over V tokens is log V; restricted to K options, log K."""
    logits = torch.zeros(1, 2, 4)  # two positions, uniform over 4 tokens
    h = token_entropy(logits)
    assert h == pytest.approx(torch.full((1, 2), math.log(4)))  # log 4 = 1.386
    opts = torch.tensor([[[0, 2], [-1, -1]]])  # position 0 restricted to tokens {0, 2}; position 1 free
    h = token_entropy(logits, opts)
    assert h[0, 0].item() == pytest.approx(math.log(2)) and h[0, 1].item() == pytest.approx(math.log(4))
    # one option only (a forced token): entropy 0
    assert token_entropy(logits, torch.tensor([[[3], [3]]]))[0].tolist() == pytest.approx([0.0, 0.0])
    # two tokens with logits (log 3, 0) and the rest at -inf-like: p = (3/4, 1/4), H = -(.75 ln .75 + .25 ln .25)
    z = torch.tensor([[[math.log(3.0), 0.0, -1e9, -1e9]]])
    assert token_entropy(z)[0, 0].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), abs=1e-6)


def test_entropy_bonus_raises_the_entropy():
    """grpo.Entropy: loss = - coef * sum_t w H_t, and its gradient raises H (one token, w = 1)."""
    from types import SimpleNamespace
    from config import get_config
    from grpo import Entropy
    z = torch.tensor([[[2.0, 0.0, 0.0]]], requires_grad=True)  # one token, a peaked distribution over 3
    H = token_entropy(z)  # [1, 1]
    mb = SimpleNamespace(entropy=H, mask=torch.ones(1, 1), weights=lambda agg: torch.ones(1))
    loss, st = Entropy(get_config(["--entropy_coef", "0.5"]))(mb)
    assert loss.item() == pytest.approx(-0.5 * H.item()) and st["entropy"] == pytest.approx(H.item())
    loss.backward()
    assert z.grad[0, 0, 0] > 0  # descending the loss lowers the peaked logit: the distribution flattens


def test_mini_batches_cut_each_group_alike_whatever_the_ranks():
    """grpo.mini_batches: each group's rows in n_mb near-equal consecutive blocks, block j of every group in
    mini-batch j, so one process and two ranks holding half the groups each form the same global mini-batches."""
    from grpo import mini_batches
    rows = [{"gid": g, "k": k} for g, n in ((0, 5), (1, 2), (2, 4), (3, 1)) for k in range(n)]
    mb = mini_batches(rows, 2)  # group 0: 5 rows -> [0, 2) and [2, 5); 1: [0, 1), [1, 2); 2: [0, 2), [2, 4); 3: -, [0, 1)
    assert [[(r["gid"], r["k"]) for r in m] for m in mb] == [
        [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)],
        [(0, 2), (0, 3), (0, 4), (1, 1), (2, 2), (2, 3), (3, 0)]]
    assert mini_batches(rows, 1) == [rows]  # one mini-batch: the rows as they are
    rank0 = [r for r in rows if r["gid"] in (0, 2)]  # tasks dealt to ranks round-robin, as train.py does
    rank1 = [r for r in rows if r["gid"] in (1, 3)]
    for n_mb in (2, 3, 5):
        single = mini_batches(rows, n_mb)
        for j, (a, b) in enumerate(zip(mini_batches(rank0, n_mb), mini_batches(rank1, n_mb))):
            key = lambda r: (r["gid"], r["k"])  # noqa: E731
            assert sorted(map(key, a + b)) == sorted(map(key, single[j]))
    assert [len(m) for m in mini_batches(rank0, 3)] == [2, 3, 4]  # group 0: 1, 2, 2 rows; group 2: 1, 1, 2


@pytest.mark.parametrize("d, want, moves", [
    (1.0, math.e - 2.0, True),              # inside both clamps: exp(1) - 1 - 1 = 0.7182818
    (2.5, math.exp(2.5) - 3.5, True),       # 12.1825 - 3.5 = 8.6825 < 10: still inside
    (3.0, 10.0, False),                     # exp(3) - 4 = 16.0855: clamped to 10, no gradient
    (25.0, 10.0, False),                    # log-ratio clamped to 20 first, then the estimate to 10
    (-30.0, 10.0, False),                   # log-ratio -> -20: exp(-20) + 20 - 1 = 19.0000000: clamped to 10
    (-5.0, math.exp(-5.0) + 4.0, True),     # 0.0067379 + 4 = 4.0067379
])
def test_k3_kl_is_clamped_like_verls_low_var_kl(d, want, moves):
    """kl = clamp(exp(d) - d - 1, -10, 10) with d = clamp(ref_lp - lp, -20, 20), per token (verl's low_var_kl)."""
    lp = torch.zeros(1, 1, requires_grad=True)
    loss, st = policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 1), torch.ones(1), 0.2,
                           ref_lp=torch.full((1, 1), d), kl_coef=1.0)
    assert st["kl"] == pytest.approx(want, rel=1e-6)
    loss.backward()
    assert (lp.grad.abs().item() > 0) == moves  # beyond a clamp the KL term pulls no more


def test_entropy_from_the_scaled_logits_has_the_gradient_of_the_plain_formula():
    """token_logprobs_entropy's entropy (its own backward from the logits: -p (log p + H)) against H = -sum softmax
    * log_softmax written out with autograd, on full and trie-restricted positions; gradcheck in float64; and its
    log-probs are token_logprobs' bit for bit (pi_old is scored without the entropy: the ratio must be exactly 1)."""
    from grpo import _EntropyOfLogits, token_logprobs_entropy
    torch.manual_seed(0)
    z = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_EntropyOfLogits.apply, (z.detach().clone().requires_grad_(),))
    assert torch.autograd.gradcheck(_EntropyOfLogits.apply, ((z.detach() * 7).requires_grad_(),))  # peaked
    opts = torch.tensor([[[0, 2], [-1, -1], [5, -1]], [[1, 3], [4, 0], [-1, -1]]])
    t = torch.tensor([[2, 1, 5], [3, 0, 4]])
    lp, h = token_logprobs_entropy(z, t, opts, 0.7)
    zt = z.float() / 0.7
    full = -(torch.softmax(zt, -1) * torch.log_softmax(zt, -1)).sum(-1)
    sub = zt.gather(-1, opts.clamp(min=0)).masked_fill(opts < 0, float("-inf"))
    restricted = -(torch.softmax(sub, -1) * torch.log_softmax(sub, -1).masked_fill(opts < 0, 0.0)).sum(-1)
    want = torch.where((opts >= 0).any(-1), restricted, full)
    assert torch.allclose(h, want, atol=1e-6)
    assert h[0, 2].item() == 0.0  # one allowed token: a forced position carries no entropy
    g1 = torch.autograd.grad(h.sum(), z, retain_graph=True)[0]
    g2 = torch.autograd.grad(want.sum(), z)[0]
    assert torch.allclose(g1, g2, atol=1e-6)
    for options in (None, opts):
        lp_only = token_logprobs(z.detach().float(), t, options, 0.7)
        assert torch.equal(token_logprobs_entropy(z.detach().float(), t, options, 0.7)[0], lp_only)


# ---- the update on the tiny model: train.py's update_policy and its loss terms
ACTS = ["go to desk 1", "take mug 1 from desk 1", "look", "inventory", "open drawer 2", "examine desk 1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from plumbing.tiny import tiny_path
    path = tiny_path(str(tmp_path_factory.mktemp("tiny")))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def fixed_batch(tok, advs=(1.5, -0.5, 0.0, -0.5, 0.7, -0.7, 0.0, 0.0), n_aux=3):
    """Step rows of 2 groups (2 episodes of 2 rows each; every 3rd row with its trie of admissible replies), with
    engine log-probs of -0.3 a token, and n_aux expert rows: the batch every update test below uses."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    reply = lambda a: enc(f"<action>{a}</action>") + [tok.eos_token_id]  # noqa: E731
    rows = []
    for j, adv in enumerate(advs):
        r = {"prompt_ids": enc(f"task {j}: put a mug in the sink")[:4 + j], "response_ids": reply(ACTS[j % 6]),
             "adv": adv, "eid": j // 2, "gid": j // 4}
        r["logprobs"] = [-0.3] * len(r["response_ids"])
        if j % 3 == 0:
            r["allowed"] = [reply(a) for a in ACTS]
        rows.append(r)
    aux = [{"prompt_ids": enc(f"expert task {j}"), "response_ids": reply(ACTS[j]), "n": 1 + j % 2, "gid": j,
            "eid": 100 + j} for j in range(n_aux)]
    return rows, aux


def learner(tiny, argv, trainer=False, terms=None):
    """(train.py's update_policy over a fresh copy of the tiny model with the config of argv, that copy)."""
    import copy
    from config import get_config
    from train_update import Learner
    model, tok = tiny
    cfg = get_config(["--preset", "cpu_pick2", *argv])
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2))
    return Learner(cfg, m, opt, tok, terms=terms, trainer=trainer), m


def moved(m, tiny):
    return max((p - q).abs().max().item() for p, q in zip(m.parameters(), tiny[0].parameters()))


def test_the_update_on_a_fixed_batch_is_the_loss_written_out(tiny):
    """cpu_pick2's update (L_GRPO with the episode aggregation + 0.5 L_aux token-mean, engine pi_old, one mini-batch)
    on a fixed batch: every logged term equals the loss written out from response_logprobs and policy_loss on the
    same rows, and the parameters equal one AdamW step on that written-out loss. Zero-advantage rows get no forward
    pass but count in the means (episode tokens, clipfrac's denominator)."""
    from grpo import agg_weights, policy_loss, response_logprobs
    model, tok = tiny
    rows, aux = fixed_batch(tok)
    learn, m = learner(tiny, [])
    out = learn.batch(rows, aux)
    assert list(out) == ["pg", "kl", "entropy", "aux", "clipfrac", "ratio_dev", "update_rel", "skipped", "grad_norm"]
    assert out["kl"] == 0.0 and out["entropy"] == 0.0 and out["update_rel"] > 0
    # written out on a fresh copy: 8 rows, 4 episodes (eid 0..3), rows 2, 6, 7 have advantage 0 and are skipped
    import copy
    ref = copy.deepcopy(model)
    live = [r for r in rows if r["adv"] != 0.0]
    assert len(live) == 5
    ep_tok = {}
    for r in rows:
        ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
    lp, mask = response_logprobs(ref, live, tok.pad_token_id)
    w = agg_weights("episode", torch.tensor([len(r["response_ids"]) for r in live]),
                    torch.tensor([ep_tok[r["eid"]] for r in live]), sum(ep_tok.values()), len(rows), 4)
    eng = torch.tensor([[-0.3] * len(r["response_ids"]) + [0.0] * (lp.shape[1] - len(r["response_ids"]))
                        for r in live])
    pg, st = policy_loss(lp, eng, torch.tensor([r["adv"] for r in live]), mask, w, 0.2)
    lp_aux, mask_aux = response_logprobs(ref, aux, tok.pad_token_id)
    nll = -(lp_aux * mask_aux).sum() / mask_aux.sum()
    assert out["pg"] == pytest.approx(st["pg"], rel=1e-5) and out["aux"] == pytest.approx(nll.item(), rel=1e-5)
    assert out["clipfrac"] == st["clipped"] / sum(len(r["response_ids"]) for r in rows)  # of all 8 rows' tokens
    assert out["ratio_dev"] == pytest.approx(st["ratio_dev"], rel=1e-5)
    # the same step by hand: L = pg + 0.5 aux, clip at 1.0, AdamW(lr 1e-4, betas (0.9, 0.99))
    (pg + 0.5 * nll).backward()
    assert out["grad_norm"] == pytest.approx(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0).item(), rel=1e-4)
    torch.optim.AdamW(ref.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0).step()
    # Adam divides each gradient by its own size: float rounding (other row order, one backward instead of two)
    # shows in near-zero gradients, within 1 % of a step of lr = 1e-4
    assert max((p - q).abs().max().item() for p, q in zip(m.parameters(), ref.parameters())) < 1e-6
    assert moved(m, tiny) > 1e-5


def test_entropy_acts_on_groups_whose_advantages_are_all_zero(tiny):
    """Every advantage 0, no KL, no aux rows: the pg term has nothing to say, and neither has the update unless an
    entropy term is on; with --entropy_coef 0.01 every row gets its forward pass and the parameters move."""
    _, tok = tiny
    for coef in ("0", "0.01"):
        rows, _ = fixed_batch(tok, advs=(0.0,) * 8)
        learn, m = learner(tiny, ["--entropy_coef", coef, "--kl_coef", "0"])
        out = learn.batch(rows, [])
        if coef == "0":  # no forward pass at all: zero gradient, no step
            assert out["grad_norm"] == 0.0 and out["update_rel"] == 0.0 and moved(m, tiny) == 0.0
            assert out["entropy"] == 0.0 and out["clipfrac"] == 0.0
        else:
            assert out["grad_norm"] > 0 and out["update_rel"] > 0 and moved(m, tiny) > 1e-5
            assert 0 < out["entropy"] < math.log(tiny[0].config.vocab_size)  # the weighted mean entropy per token
            assert out["pg"] == 0.0


@pytest.mark.parametrize("coef", ["0", "0.01"])
def test_ratio_is_exactly_one_at_step_0_with_trainer_pi_old(tiny, coef):
    """One mini-batch, pi_old scored by the trainer: pi / pi_old is exactly 1 whether or not the entropy term asks
    for the entropy in the loss's forward (pi_old is always scored one way, with the same log-prob formula)."""
    _, tok = tiny
    rows, aux = fixed_batch(tok)
    learn, _ = learner(tiny, ["--entropy_coef", coef, "--old_logprobs", "trainer"], trainer=True)
    out = learn.batch(rows, aux)
    assert out["ratio_dev"] == 0.0 and out["clipfrac"] == 0.0
    assert out["lp_diff_max"] > 0  # the engine's -0.3 a token is not the tiny model's


def test_make_terms_picks_each_term_from_its_flag():
    from config import get_config
    from grpo import AuxTerm, PolicyTerm, make_terms
    from variants.losses import TIS, Entropy, PrefixMeanAux
    kinds = lambda argv, ref=None: [type(t) for t in make_terms(get_config(argv), ref)]  # noqa: E731
    assert kinds(["--preset", "cpu_pick2"]) == [PolicyTerm, AuxTerm]
    assert kinds(["--preset", "cpu_pick2", "--eta", "0"]) == [PolicyTerm]
    assert kinds(["--preset", "cpu_pick2", "--aux_agg", "prefix-mean", "--tis_cap", "2", "--entropy_coef",
                  "0.01"]) == [TIS, PrefixMeanAux, Entropy]
    for mode in ("aux_only", "sft_full", "sft_prefix"):  # no pg term, the NLL alone at weight 1
        (term,) = make_terms(get_config(["--mode", mode, "--eta", "0.5", "--entropy_coef", "0.01"]))
        assert type(term) is AuxTerm and term.weight == 1.0
    policy, aux = make_terms(get_config(["--preset", "cpu_pick2"]))
    assert not policy.zero_adv and aux.weight == 0.5 and aux.rows == "aux"
    assert make_terms(get_config(["--kl_coef", "0.01"]), ref=object())[0].zero_adv  # the KL needs every row
    with pytest.raises(SystemExit):
        get_config(["--loss_terms", "no_such_term"])


def test_the_update_reads_no_loss_setting():
    """The update (train.py's update_policy, the rank wrapper plumbing/lockstep.py:Ranks and grpo.py's micro_batches)
    reads the config's batching fields (rows per micro-batch and mini-batch, rows packed per forward), the clip and
    the stop's two bounds (Ranks.stop); the temperature is bound once in train.py's `score`: which terms run, with
    which weights, was decided once by make_terms (and the variant terms' constructors)."""
    import ast
    import os
    root = os.path.dirname(os.path.dirname(__file__))

    def unit(path, name):
        tree = ast.parse(open(os.path.join(root, path)).read())
        return next(n for n in tree.body if getattr(n, "name", None) == name)
    parts = [unit("train.py", "update_policy"), unit("plumbing/lockstep.py", "Ranks"),
             unit("plumbing/lockstep.py", "Tally"), unit("grpo.py", "micro_batches")]
    read = {n.attr for part in parts for n in ast.walk(part) if isinstance(n, ast.Attribute) and
            (isinstance(n.value, ast.Name) and n.value.id == "cfg" or
             isinstance(n.value, ast.Attribute) and n.value.attr == "cfg")}
    assert read == {"ppo_mini_batch", "micro_batch", "pack_tokens", "grad_clip", "max_update", "max_bad_steps"}, read
    assert not [n for part in parts for n in ast.walk(part) if isinstance(n, ast.Name) and n.id == "getattr"]


def test_terms_with_the_same_stat_name_are_refused(tiny):
    from grpo import Term

    class Twice(Term):
        stats = ("pg",)
    with pytest.raises(ValueError, match="unique"):
        learner(tiny, [], terms=[Twice(None), Twice(None)])


def test_entropy_term_by_hand():
    """grpo.Entropy: - coef * sum_t w H_t, logged as sum_t w H_t (uniform over 4 tokens: H = log 4)."""
    from types import SimpleNamespace
    from config import get_config
    from grpo import Entropy
    term = Entropy(get_config(["--entropy_coef", "0.5", "--loss_agg", "seq-mean-token-sum"]))
    mb = SimpleNamespace(entropy=torch.full((2, 3), math.log(4)), mask=torch.tensor([[1.0, 1.0, 0.0], [1.0] * 3]),
                         weights=lambda agg: agg_weights(agg, torch.tensor([2, 3]), torch.tensor([2, 3]), 5, 2, 2))
    loss, stats = term(mb)
    # seq-mean-token-sum over 2 rows: w = 1/2 per token; 5 tokens of H = log 4 -> 2.5 log 4 = 3.4657
    assert stats["entropy"] == pytest.approx(2.5 * math.log(4))
    assert loss.item() == pytest.approx(-0.5 * 2.5 * math.log(4))


STEP_REC = {"step": 3, "success": 0.25, "in_band": 0.5, "all0": 0.25, "all1": None, "pg": 0.01234, "aux": 1.5,
            "kl": 0.0, "clipfrac": 0.125, "update_rel": 0.00123, "mu_global": 0.4, "mu_k": [0.3], "sigma_k": [0.1],
            "A": [0.5], "V": [0.25], "mean_n": 2.0, "rollouts": 8, "probe_rollouts": 0, "tokens": 512,
            "truncated_share": 0.0, "t_probe": 0.0, "t_rollout": 1.25, "t_train": 0.5, "t_sync": 0.01}


def test_step_line_keeps_its_look_and_appends_a_terms_own_stats():
    from plumbing.report import step_line
    assert step_line(STEP_REC) == (
        "step    3 | succ 0.25 band 0.50 0s 0.25 1s - | pg +0.0123 aux 1.500 kl 0.0000 clip 0.125 upd 1.2e-03 | "
        "mu_g 0.40 k0:0.30/0.10/0.50/0.250 | n 2.0 | roll 8+0 tok 512 trunc 0% | "
        "t probe 0.0 roll 1.2 train 0.5 sync 0.01s")
    line = step_line({**STEP_REC, "sil": 0.123456, "term_stats": ["sil"]})
    assert "upd 1.2e-03 sil 0.1235 | mu_g" in line


def readme_term(tmp_path, monkeypatch):
    """README "Hack it": the loss-term block, written to its own file and importable as my_loss."""
    import os
    import re
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if b.startswith("# my_loss.py"))
    (tmp_path / "my_loss.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_loss:SelfImitation"


def test_the_readme_loss_term_runs_as_one_file(tiny, tmp_path, monkeypatch):
    """The README's term, selected with --loss_terms: built by make_terms, its stat in update_policy's output (so in
    log.jsonl) and on the step line, with no edit to grpo.py, train.py or plumbing/report.py."""
    import sys
    from plumbing.report import step_line
    name = readme_term(tmp_path, monkeypatch)
    _, tok = tiny
    rows, aux = fixed_batch(tok)
    try:
        learn, m = learner(tiny, ["--loss_terms", name])
        out = learn.batch(rows, aux)
        plain = learner(tiny, [])[0].batch(*fixed_batch(tok))
    finally:
        sys.modules.pop("my_loss", None)
    assert out["term_stats"] == ["sil"] and 0 < out["sil"] < 50  # the NLL of the positive-advantage rows' tokens
    assert {k: out[k] for k in ("pg", "aux", "clipfrac")} == {k: plain[k] for k in ("pg", "aux", "clipfrac")}
    assert out["grad_norm"] != plain["grad_norm"]  # its gradient went into the step
    assert f"sil {out['sil']:.4g} |" in step_line({**STEP_REC, **out})


@pytest.mark.slow
def test_the_readme_loss_term_in_a_training_run(tmp_path, monkeypatch):
    """python train.py --loss_terms my_loss:SelfImitation for one step: its stat in log.jsonl and on the step line."""
    import json
    import os
    import subprocess
    import sys
    name = readme_term(tmp_path, monkeypatch)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "train.py", "--preset", "cpu", "--model", "tiny", "--steps", "1",
                        "--batch_tasks", "2", "--group_size", "2", "--max_steps", "4", "--eval_games", "-1",
                        "--train_panel", "0", "--num_workers", "1", "--engine", "hf", "--ckpt_every", "0",
                        "--loss_terms", name, "--out_dir", str(out)], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(tmp_path)}, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    (rec,) = [json.loads(line) for line in open(out / "log.jsonl") if '"eval"' not in line]
    assert rec["term_stats"] == ["sil"] and rec["sil"] == rec["sil"]  # logged, finite
    assert f" sil {rec['sil']:.4g} |" in p.stdout + p.stderr


# ---- rows that share a prefix share a forward pass (--pack_tokens)
def test_pack_rows_by_hand():
    """pack_rows reads a row's prompt and response but its last token. Row 1 repeats row 0's 4 tokens and adds 2
    (2 of 6 new: joins, 6 tokens; over a limit of 5 it starts a pack of its own); row 2 shares 1 of its 4 with
    rows 0-1 (3 new > half: a new pack); row 3 shares 3 of 4 with row 2 (1 new: 5 tokens); row 4 shares 4 of 6
    with row 3 (2 new: 7 tokens, over a limit of 5)."""
    from plumbing.packing import pack_rows
    row = lambda p, r: {"prompt_ids": p, "response_ids": r}  # noqa: E731
    rows = [row([1, 2, 3], [4, 9]), row([1, 2, 3, 4, 5], [6, 9]), row([1, 7, 8], [5, 9]),
            row([1, 7, 8], [6, 9]), row([1, 7, 8, 6], [2, 3, 9])]
    assert pack_rows(rows[:2], 100) == [(6, [0, 1])]
    assert pack_rows(rows, 5) == [(4, [0]), (6, [1]), (5, [2, 3]), (6, [4])]
    assert pack_rows(rows, 100) == [(6, [0, 1]), (7, [2, 3, 4])]


ROOM = "room: armchair 1, bed 1, cabinet 1, desk 1, drawer 2, drawer 1, dresser 1, garbagecan 1, sidetable 1"


def shared_rows(tok, n_groups=2, episodes=2, turns=3):
    """Rows as an episode makes them: turn t's prompt is the task, the actions done so far and the current
    observation, so each turn repeats most of the turn before it; the first turns of a group are equal. Every
    other row carries its trie of admissible replies."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    reply = lambda a: enc(f"<action>{a}</action>") + [tok.eos_token_id]  # noqa: E731
    rows = []
    for g in range(n_groups):
        for e in range(episodes):
            for t in range(turns):
                done = " | ".join(ACTS[(g + e + k) % 6] for k in range(t))
                r = {"prompt_ids": enc(f"task: put a mug {g} in the sink\n{ROOM}\ndone: {done}\nnow: desk {t}"),
                     "response_ids": reply(ACTS[(g + e + t) % 6]), "adv": (-1.0) ** (e + t) * (0.5 + 0.1 * t),
                     "gid": g, "eid": 10 * g + e, "t": t}
                r["logprobs"] = [-0.3] * len(r["response_ids"])
                if (e + t) % 2 == 0:
                    r["allowed"] = [reply(a) for a in ACTS]
                rows.append(r)
    aux = [{"prompt_ids": enc(f"task: put a mug {g} in the sink\n{ROOM}\ndone: {' | '.join(ACTS[:t])}\nnow: a room"),
            "response_ids": reply(ACTS[t]), "n": 2, "gid": g, "t": t} for g in range(n_groups) for t in range(2)]
    return rows, aux


def test_packed_rows_score_as_one_row_a_sequence(tiny):
    """The same log-probs, entropies and gradients (1e-6, relative) whether each row has its own padded sequence or
    rows that share a prefix share one sequence; and the packing does share (fewer sequences than rows)."""
    import copy
    from grpo import response_logprobs
    from plumbing.packing import pack_rows
    model, tok = tiny
    rows, _ = shared_rows(tok)
    assert len(pack_rows(rows, 512)) < len(rows) / 2
    got = {}
    for pack in (0, 512):
        m = copy.deepcopy(model)
        lp, mask, ent = response_logprobs(m, rows, tok.pad_token_id, temperature=0.7, entropy=True, pack=pack)
        (lp.sum() + 0.3 * ent.sum()).backward()
        got[pack] = lp.detach(), mask, ent.detach(), torch.cat([p.grad.flatten() for p in m.parameters()])
    for a, b in zip(got[0], got[512]):
        assert a.shape == b.shape and ((a - b).norm() / a.norm()).item() < 1e-6
    assert torch.equal(got[0][1], got[512][1])


@pytest.mark.parametrize("argv", [[], ["--entropy_coef", "0.01", "--kl_coef", "0.01", "--ppo_mini_batch", "5",
                                       "--dual_clip", "3", "--aux_agg", "prefix-mean", "--micro_batch", "4"]])
def test_the_update_is_the_same_with_rows_packed(tiny, argv):
    """update_policy on a fixed batch whose rows share prefixes, --pack_tokens 0 (one padded sequence a row) and
    512: every logged term (1e-6 relative, or 1e-7 absolute for terms that cancel), the last mini-batch's gradients
    and the new parameters agree to 1e-6 (relative)."""
    _, tok = tiny
    out, grads, params = {}, {}, {}
    for pack in ("0", "512"):
        rows, aux = shared_rows(tok)
        learn, m = learner(tiny, argv + ["--pack_tokens", pack])
        if learn.cfg.kl_coef > 0:  # the reference: the tiny model as it was
            import copy
            from train_update import Learner
            learn = Learner(learn.cfg, m, learn.opt, tok, ref=copy.deepcopy(tiny[0]).requires_grad_(False))
        out[pack] = learn.batch(rows, aux)
        grads[pack] = torch.cat([p.grad.flatten() for p in m.parameters()])
        params[pack] = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert out["0"].keys() == out["512"].keys()
    assert ("--kl_coef" not in argv) or (out["0"]["kl"] > 0 and out["0"]["entropy"] > 0)
    # abs: pg is a signed mean of terms of size ~0.5 (ratio * A) that cancel to ~3e-3; float32 rounds each term at
    # ~3e-8 and packing changes the matmul shapes, hence the order of rounding (pg came out 5e-9 apart on one
    # CPU, 2e-6 relative): the comparison is on the terms' scale, where packed positions doubled or a mask that
    # lets each token see the next moves pg by 2e-5 to 3e-5
    for k, v in out["0"].items():
        assert out["512"][k] == pytest.approx(v, rel=1e-6, abs=1e-7), k
    assert ((grads["0"] - grads["512"]).norm() / grads["0"].norm()).item() < 1e-6
    assert ((params["0"] - params["512"]).norm() / params["0"].norm()).item() < 1e-6


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend on the current token alone (a V x V table): the model call
    response_logprobs makes (input_ids, attention_mask, position_ids, logits_to_keep, use_cache) -> .logits."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, use_cache=False):
        from types import SimpleNamespace
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_aux_is_the_trie_restricted_nll_at_the_rollout_temperature_by_hand(temperature):
    """L_aux on two expert rows of a 4-token vocabulary (0 prompt, 1, 2, 3 = EOS), the admissible replies [1, EOS]
    and [2, 1, EOS]; after token 0 the logits are (0, 0, ln 3, ln 4), after 1 and 2 all 0.
    Restricted (the rows carry "allowed"): the first token chooses between 1 and 2, the rest is forced (log-prob 0).
      T = 1:   target 2: p = 3 / (1 + 3);          target 1: p = 1 / 4       -> aux = (ln 4/3 + ln 4) / 5 tokens
      T = 0.5: logits / T = (0, 0, ln 9, ln 16):  p(2) = 9 / 10, p(1) = 1 / 10 -> aux = (ln 10/9 + ln 10) / 5
    Over the whole vocabulary (no "allowed", as before the fix), T = 1: p(2) = 3 / 9 and p(1) = 1 / 9 first, then
    p = 1 / 4 at each of the other three tokens -> (ln 3 + ln 9 + 3 ln 4) / 5."""
    from types import SimpleNamespace
    from config import Config
    from grpo import MicroBatch, make_terms, response_logprobs, terms_loss
    ln = math.log
    table = [[0.0, 0.0, ln(3), ln(4)], [0.0] * 4, [0.0] * 4, [0.0] * 4]
    allowed = [[1, 3], [2, 1, 3]]
    rows = [{"prompt_ids": [0], "response_ids": [2, 1, 3], "n": 2, "allowed": allowed},
            {"prompt_ids": [0], "response_ids": [1, 3], "n": 2, "allowed": allowed}]
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=3)
    cfg = Config(eta=0.5, temperature=temperature, pack_tokens=0)
    want = {1.0: (ln(4 / 3) + ln(4)) / 5, 0.5: (ln(10 / 9) + ln(10)) / 5}[temperature]
    aux_terms = [t for t in make_terms(cfg) if t.rows == "aux"]

    def micro_loss(rows, stats):  # train.py's micro-batch: log-probs at the rollout temperature, then the terms
        lp, mask = response_logprobs(Bigram(table), rows, tok.pad_token_id, temperature=temperature)
        return terms_loss(aux_terms, MicroBatch(rows, lp, mask, None, {"aux_tokens": 5, "aux_weight": 1.0}, {}),
                          stats)
    stats = {"aux": 0.0}
    loss = micro_loss(rows, stats)
    assert stats["aux"] == pytest.approx(want, rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * want, rel=1e-6)  # times eta
    if temperature == 1.0:
        stats = {"aux": 0.0}
        micro_loss([{k: v for k, v in r.items() if k != "allowed"} for r in rows], stats)
        assert stats["aux"] == pytest.approx((ln(3) + ln(9) + 3 * ln(4)) / 5, rel=1e-6)


def test_a_reference_is_loaded_only_for_the_pg_terms_kl():
    """train.py loads the reference when needs_reference says so: --kl_coef > 0 under --mode grpo; --mode aux_only
    (the aux term alone, no KL) and the SFT modes load none, whatever --kl_coef says."""
    from config import Config
    from grpo import needs_reference
    assert needs_reference(Config(kl_coef=0.01, mode="grpo"))
    assert not needs_reference(Config(kl_coef=0.0, mode="grpo"))
    for mode in ("aux_only", "sft_full", "sft_prefix"):
        assert not needs_reference(Config(kl_coef=0.01, mode=mode))
        assert all(not getattr(t, "with_kl", False) for t in make_terms_of(mode))


def make_terms_of(mode):
    from config import Config
    from grpo import make_terms
    return make_terms(Config(kl_coef=0.01, mode=mode), ref=None)


def test_a_non_finite_mini_batch_is_skipped_alone_and_counted(tiny):
    """--ppo_mini_batch 4 on the fixed batch's 8 rows: two optimizer steps. A term whose loss is NaN on the mini-batch
    that holds the row of advantage 1.5 makes that one take no step; the other steps (update_rel > 0), the update
    says skipped = 1, and grad_norm is the mean over the steps taken (finite), not NaN."""
    from grpo import Term

    class NanOnFirst(Term):
        rows, stats = "step", ("nan_probe",)

        def __init__(self, cfg):
            pass

        def __call__(self, mb):
            bad = any(r["adv"] == 1.5 for r in mb.rows)
            loss = -(mb.lp * mb.mask).sum() * (float("nan") if bad else 1e-3)
            return loss, {"nan_probe": float(bad)}

    model, tok = tiny
    rows, aux = fixed_batch(tok)
    learn, m = learner(tiny, ["--ppo_mini_batch", "4"], terms=[NanOnFirst(None)])
    out = learn.batch(rows, aux)
    assert out["skipped"] == 1 and out["update_rel"] > 0 and math.isfinite(out["grad_norm"])
    learn, m = learner(tiny, ["--ppo_mini_batch", "4"], terms=[NanOnFirst(None)])
    out = learn.batch([dict(r, adv=1.5) for r in rows], aux)  # every mini-batch non-finite
    assert out["skipped"] == 2 and out["update_rel"] == 0 and math.isnan(out["grad_norm"]) and moved(m, tiny) == 0


def test_the_update_on_a_fixed_batch_is_the_same_as_before(tmp_path):
    """tests/update_digest.py on this checkout against tests/data/update_digest.json, which the same script wrote
    at a698814 (before the sampling-streams and speed work): under three configurations (cpu_pick2's update;
    PPO mini-batches with the trainer's pi_old and an entropy term; token-mean without packing) every stat, and per
    parameter the sum, norm and first values of the new weights and of the last gradient, equal to float noise
    across CPUs. On another CPU than the one that wrote the file (torch's AVX-512 kernels, oneDNN's AMX paths) the
    stats moved by up to 9.6e-7 relative (compared at 1e-5), the norms by up to 1.3e-5 (at 1e-4), sums and first
    values by up to 1.6e-6 of their tensor's norm (at 1e-5), the worst on the attention projections' biases,
    tensors of small norm (~1e-3 as weights, ~5e-5 as gradients). A change to the update moves the gradients'
    norms by far more."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, os.path.join(root, "tests", "update_digest.py"), root, str(tmp_path / "d.json")],
                   check=True, capture_output=True, timeout=600)
    got, want = json.load(open(tmp_path / "d.json")), json.load(open(os.path.join(root, "tests", "data",
                                                                                   "update_digest.json")))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name]["stats"] == pytest.approx(want[name]["stats"], rel=1e-5, abs=1e-12), name
        for part in ("params", "grads"):
            assert got[name][part].keys() == want[name][part].keys()
            for k, (s, n, head) in want[name][part].items():
                g = got[name][part][k]
                assert g[1] == pytest.approx(n, rel=1e-4), (name, part, k)
                assert g[0] == pytest.approx(s, rel=1e-6, abs=1e-5 * max(n, 1.0)), (name, part, k)
                assert g[2] == pytest.approx(head, rel=1e-6, abs=1e-5 * n), (name, part, k)

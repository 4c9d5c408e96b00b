"""Loss terms beside the paper's (grpo.PolicyTerm, grpo.AuxTerm, grpo.Entropy), each a grpo.Term chosen once
at setup by grpo.make_terms through config.variant; the update sums whatever the active terms return.

  entropy      grpo.Entropy, here by name too (--loss_terms entropy)
  prefix-mean  [released] --aux_agg prefix-mean: L_aux as the authors' prefix SFT (each row's token mean,
                          weight 1/n in its n-step prefix, normalised by the weights)
  sft          [baseline] --mode aux_only | sft_full | sft_prefix: no pg term, the aux NLL alone at weight 1
                          (the modes differ in the rows train.py hands the update, not here)
  tis          [beyond]   --tis_cap C > 0: the pg term with a truncated importance weight min(pi_old /
                          pi_engine, C) per token (verl's tis_imp_ratio_cap)

A term of your own: a grpo.Term subclass in a file of yours, --loss_terms file:Class (README "Hack it").
"""
import torch

from grpo import AuxTerm, Entropy, PolicyTerm


class PrefixMeanAux(AuxTerm):
    """[released] The authors' prefix SFT: each expert row's token mean, weight 1/n in its n-step prefix,
    normalised by the mini-batch's global sum of the weights [ZJU-REAL/Agent-G2
    verl/workers/actor/dp_actor.py]."""

    def __call__(self, mb):
        w = self.weight
        row_w = torch.tensor([1.0 / r["n"] for r in mb.rows], device=mb.device)  # [b]
        row_mean = (mb.lp * mb.mask).sum(-1) / mb.mask.sum(-1).clamp(min=1)  # [b]
        loss = -(row_w * row_mean).sum() / max(mb.counts["aux_weight"], 1e-12) * w
        return loss, {"aux": loss.item() / w}


def sft(cfg):
    """[baseline] --mode aux_only | sft_full | sft_prefix: the aux term alone, weight 1 instead of eta (its
    aggregation still by --aux_agg)."""
    return (PrefixMeanAux if cfg.aux_agg == "prefix-mean" else AuxTerm)(cfg, weight=1.0)


class TIS(PolicyTerm):
    """[beyond] The pg term with a truncated importance weight min(pi_old / pi_engine, --tis_cap) per token
    (a constant: no gradient), for the mismatch between the engine that sampled and the trainer that
    scores."""

    def __init__(self, cfg, with_kl=False):
        super().__init__(cfg, with_kl)
        self.cap = cfg.tis_cap

    def importance(self, old, engine):  # [b, T] each
        return tis_weights(old, engine, self.cap)


def tis_weights(old_lp, engine_lp, cap):
    """Truncated importance sampling weights min(pi_old / pi_engine, cap) per token ([b, T] each), as verl's
    tis_imp_ratio_cap (verl/trainer/ppo/core_algos.py): old_lp from the trainer, engine_lp as the engine
    sampled."""
    return torch.exp(old_lp - engine_lp).clamp(max=cap)


REGISTRY = {"entropy": Entropy, "prefix-mean": PrefixMeanAux, "sft": sft, "tis": TIS}

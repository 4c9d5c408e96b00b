"""train.py's update_policy, run outside train.py: its source, compiled from train.py itself, over a model, an
optimizer and a config that a test builds (one process), with the same setup lines train.py runs before it.

    learn = Learner(cfg, model, opt, tok, ref=None, terms=None, trainer=False)
    out = learn.batch(rows, aux)      # update_policy(rows, aux) -> the logged values
    learn.stop(out)                   # plumbing.lockstep.Ranks.stop
"""
import ast
import contextlib
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_function(name, namespace, root=ROOT):
    """The top-level function `name` of train.py, compiled from its source with `namespace` as its globals."""
    tree = ast.parse(open(os.path.join(root, "train.py")).read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), "train.py", "exec"), namespace)
    return namespace[name]


class Learner:
    """train.py's setup of the update (terms, by_rows, score, old_key, ref_lp, ranks), then update_policy."""

    def __init__(self, cfg, model, opt, tok, ref=None, terms=None, trainer=False, device="cpu"):
        import grpo
        from plumbing.lockstep import Ranks, check_terms
        self.cfg, self.opt, self.model = cfg, opt, model
        terms = grpo.make_terms(cfg, ref) if terms is None else list(terms)
        score = functools.partial(grpo.response_logprobs, pad_id=tok.pad_token_id, device=device,
                                  temperature=cfg.temperature, pack=cfg.pack_tokens)
        self.ranks = Ranks(cfg, model, model, ref, terms, score, old_from_trainer=trainer,
                           dummy={"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]})
        names = ("MicroBatch", "batch_counts", "forward_rows", "micro_batches", "mini_batches", "terms_loss")
        ns = {name: getattr(grpo, name) for name in names}
        ns.update(cfg=cfg, opt=opt, model=model, terms=terms, by_rows=check_terms(terms), score=score,
                  prec=contextlib.nullcontext, ranks=self.ranks, old_key="old_lp" if trainer else "logprobs",
                  ref_lp=ref and (lambda rows: score(ref, rows)[0]))
        self.batch = train_function("update_policy", ns)
        self.stop = self.ranks.stop

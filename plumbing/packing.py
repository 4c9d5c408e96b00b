"""Rows that share a prompt prefix share one forward pass (--pack_tokens): a turn repeats most of the turn
before it (the task, the actions so far), and the first turns of a group are alike. grpo.response_logprobs
calls packed_logits when pack_rows puts two rows or more in one sequence; the logits are the ones each row
would get alone (tests/test_grpo.py compares log-probs, entropies, gradients and whole updates, packed and
not).
"""
import torch


def pack_rows(rows, limit):
    """Rows, in order, into packs: a row joins the pack before it when at most half of its tokens are new to
    the pack (the rest is a prefix some row of the pack already has: a turn after the previous turn of its
    episode, the R episodes of a group) and the pack stays within `limit` tokens.
    -> [(the pack's tokens, [row index])]."""
    packs, trie = [], None
    for b, r in enumerate(rows):
        seq = _scored_seq(r)
        node, shared = trie, 0
        while node is not None and shared < len(seq) and seq[shared] in node:
            node, shared = node[seq[shared]], shared + 1
        new = len(seq) - shared
        if trie is None or 2 * new > len(seq) or packs[-1][0] + new > limit:
            packs.append((0, []))
            trie, new = {}, len(seq)
        packs[-1] = (packs[-1][0] + new, packs[-1][1] + [b])
        node = trie
        for t in seq:
            node = node.setdefault(t, {})
    return packs


def packed_micro_batches(rows, limit, size):
    """Micro-batches of up to `size` rows (a pack larger than that alone) made of whole packs, sorted by their
    tokens: rows in task, episode and turn order, so each turn follows the turn before it and the first turns
    of a group follow each other. None when no two rows share a pack."""
    rows = sorted(rows, key=lambda r: (r["gid"], r.get("eid", 0), r.get("t", 0)))
    packs = sorted(pack_rows(rows, limit), key=lambda p: p[0])
    if len(packs) == len(rows):
        return None
    out = [[]]
    for _, pk in packs:
        if out[-1] and len(out[-1]) + len(pk) > size:
            out.append([])
        out[-1] += [rows[b] for b in pk]
    return out


def _scored_seq(r):
    # the tokens a row's forward reads: its prompt and response but the last token (a target only)
    return r["prompt_ids"] + r["response_ids"][:-1]


def packed_logits(model, rows, packs, n, pad_id, device):
    """The response logits of `rows` ([b, n, V]) from one sequence per pack: each distinct prefix of a pack's
    rows once (a token trie), each token at its position in its row and attending to its own prefix alone (a
    [packs, 1, W, W] boolean mask, W the widest pack), so every row sees what it would see alone. A pack's
    scored tokens (the last prompt token and the response but its last token, of every row) come last and the
    packs are left-padded, so the logits of the last K columns hold them all (logits_to_keep, as unpacked).
    Transformers takes a 4D mask as given (transformers/masking_utils.py: "If the mask is already 4D, simply
    return as-is")."""
    seqs = []
    for pk in packs:
        index, token, depth, scored = {}, [], [], set()  # index: (parent node, token) -> node
        paths = []  # per row: its nodes, and how many of them (a prefix) an earlier row of the pack made
        for b in pk:
            r, node, path, old = rows[b], -1, [], None
            for t in _scored_seq(r):
                key = (node, t)
                if key not in index:
                    old = len(path) if old is None else old
                    index[key] = len(token)
                    token.append(t)
                    depth.append(len(path))
                node = index[key]
                path.append(node)
            p = len(r["prompt_ids"])
            scored.update(path[p - 1:p - 1 + len(r["response_ids"])])
            paths.append((path, len(path) if old is None else old))
        order = [i for i in range(len(token)) if i not in scored] + sorted(scored)  # scored nodes last
        seqs.append((token, depth, order, paths, len(scored)))
    width, K = max(len(s[0]) for s in seqs), max(s[4] for s in seqs)
    input_ids = torch.full((len(packs), width), pad_id, dtype=torch.long)  # [packs, width]
    positions = torch.zeros((len(packs), width), dtype=torch.long)
    allowed = torch.zeros((len(packs), 1, width, width), dtype=torch.bool)  # query attends key
    allowed[:, 0].diagonal(dim1=-2, dim2=-1).fill_(True)  # a padding column attends itself: no empty softmax
    rows_at = [None] * len(rows)
    for k, (pk, (token, depth, order, paths, _)) in enumerate(zip(packs, seqs)):
        cols = torch.empty(len(token), dtype=torch.long)
        cols[torch.tensor(order)] = torch.arange(width - len(order), width)  # node -> column, left-padded
        input_ids[k, cols] = torch.tensor(token)
        positions[k, cols] = torch.tensor(depth)
        for b, (path, old) in zip(pk, paths):
            c = cols[path]  # [len(path)]: the row's columns, in its order
            # a node attends to its path from the root, the same for every row through it: only the nodes
            # this row made get their mask rows (node i of the path: the first i + 1 columns)
            new_rows = torch.ones(len(c) - old, len(c), dtype=torch.bool).tril(old)  # [new nodes, path]
            allowed[k, 0, c[old:, None], c[None, :]] = new_rows
            p = len(rows[b]["prompt_ids"])
            rows_at[b] = (k, c[p - 1:p - 1 + len(rows[b]["response_ids"])] - (width - K))
    out = model(input_ids=input_ids.to(device), attention_mask=allowed.to(device),
                position_ids=positions.to(device), logits_to_keep=K, use_cache=False).logits  # [packs, K, V]
    logits = out.new_zeros((len(rows), n, out.shape[-1]))  # [b, n, V]; padding positions stay 0 (masked)
    dev = out.device
    pick_k = torch.tensor([k for k, c in rows_at for _ in c], device=dev)  # pack, column: where each scored
    pick_c = torch.cat([c for _, c in rows_at]).to(dev)                    # position is
    pick_b = torch.tensor([b for b, (_, c) in enumerate(rows_at) for _ in c], device=dev)  # row, response
    pick_j = torch.cat([torch.arange(len(c)) for _, c in rows_at]).to(dev)                   # position
    return logits.index_put((pick_b, pick_j), out[pick_k, pick_c])

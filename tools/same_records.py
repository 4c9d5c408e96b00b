"""Do two runs compute the same thing? Their log.jsonl records compared field by field, timings aside:
every value that is not a float must be equal (counts, depths, flags, keys, per-type tallies); floats are
reported by their largest difference, relative where a value is at least 1e-3 and absolute below (a pg
that cancels to 1e-9 has no relative scale). Two runs of one commit differ in the floats by float noise
(the engine's log-probs move by ~1e-7 between runs), so read the float line beside such a pair.

    python -m tools.same_records RUN_A RUN_B [--show 5]      # exit 1 if a non-float field differs
"""
import argparse
import json
import math
import os
import sys


def timing(key):  # seconds and memory: never the same twice
    return key.startswith("t_") or key in ("wall_s", "mem_peak_gb", "s_per_step")


def compare(a, b, path="", worst=None):
    """Records (or any JSON values) a, b -> (the paths whose non-float values differ, {path: float diff})."""
    worst = {} if worst is None else worst
    if isinstance(a, dict) and isinstance(b, dict):
        ka, kb = {k for k in a if not timing(k)}, {k for k in b if not timing(k)}
        if ka != kb:
            return [f"{path}: keys {sorted(ka ^ kb)}"], worst
        return [d for k in sorted(ka) for d in compare(a[k], b[k], f"{path}.{k}", worst)[0]], worst
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"], worst
        return [d for i, (x, y) in enumerate(zip(a, b))
                for d in compare(x, y, f"{path}[{i}]", worst)[0]], worst
    if isinstance(a, float) and isinstance(b, float):
        if a != b and not (math.isnan(a) and math.isnan(b)):
            worst[path] = abs(a - b) / max(abs(a), abs(b), 1e-3)
        return [], worst
    return ([] if a == b else [f"{path}: {a!r} against {b!r}"]), worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=2)
    ap.add_argument("--show", type=int, default=3, help="how many of the largest float differences to name")
    args = ap.parse_args(argv)
    logs = [[json.loads(line) for line in open(os.path.join(r, "log.jsonl"))] for r in args.runs]
    if len(logs[0]) != len(logs[1]):
        sys.exit(f"{len(logs[0])} records against {len(logs[1])}")
    diffs, worst = compare(logs[0], logs[1])
    top = sorted(worst.items(), key=lambda kv: -kv[1])[:args.show]
    print(f"{len(logs[0])} records; non-float values that differ: {len(diffs)}"
          + "".join(f"\n  {d}" for d in diffs[:10]))
    print(f"floats that differ: {len(worst)}; the largest (relative, absolute under 1e-3): "
          + (", ".join(f"{p.lstrip('.')} {v:.2g}" for p, v in top) or "none"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks: each prints a table (and --json PATH writes the same numbers).

    python bench.py sched [--json out.json]    # every scheduler on a simulated task population, 5 seeds
    python bench.py env                        # engine load/reset/step, prefix replay, pool throughput, memory
    python bench.py rollout                    # tokens/s HF vs vLLM, weight-sync time, rollout time split
    python bench.py step                       # one training step's time breakdown for the cpu preset
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["sched", "env", "rollout", "step"])
    ap.add_argument("--json", default="", help="also write the numbers here")
    ap.add_argument("--seeds", type=int, default=5)
    a, rest = ap.parse_known_args()
    sys.exit(f"bench.py {a.what}: not built yet")


if __name__ == "__main__":
    main()

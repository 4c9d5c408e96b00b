"""run_all.sh: the paper grid as a dry run, and every grid entry for one step at toy scale (--cpu --smoke)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = ["g2", "grpo", "fixed", "linear", "cosine", "step", "target_acc", "binary", "enum"]
ABLATIONS = ["no_sampling", "uniform", "no_adapt_centre", "no_adapt_spread", "no_aux", "no_grpo"]
CLUSTERS = ["K1", "K5", "K10", "random"]
SFT = ["sft_full", "sft_prefix"]
WEBSHOP = ["ws_" + m for m in MAIN]  # GPU: every main method on the official WebShop; CPU: g2 and grpo on lite


def sh(*args, env=None, timeout=60):
    return subprocess.run(["bash", "run_all.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_dry_run_lists_the_whole_paper_grid():
    p = sh("--dry-run")
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("torchrun")]
    names = MAIN + ABLATIONS + CLUSTERS + SFT + ["released"] + WEBSHOP
    assert len(lines) == 5 * len(names) and p.stdout.strip().endswith(f"# {5 * len(names)} runs (gpu, seeds: 0 1 2 3 4)")
    for n in names:
        for s in range(5):
            assert sum(f"--out_dir runs/paper_grid/{n}/s{s} " in x for x in lines) == 1, (n, s)
    assert all("--preset paper" in x for x in lines)
    seven = sh("--dry-run", "--7b").stdout
    assert seven.count("--model Qwen/Qwen2.5-7B-Instruct --parallel fsdp") == 10
    assert sh("--dry-run", "--only", "sft").stdout.count("torchrun") == 10
    ws = [x for x in sh("--dry-run", "--only", "webshop").stdout.splitlines() if x.startswith("torchrun")]
    assert len(ws) == 45 and all("--env webshop --webshop_backend official --max_steps 15" in x for x in ws)
    assert sh("--only", "bogus").returncode == 2 and sh("--smoke").returncode == 2


@pytest.mark.slow
def test_cpu_smoke_grid_gives_every_entry_its_step(tmp_path):
    p = sh("--cpu", "--smoke", env={"RUN_ROOT": str(tmp_path), "TQDM_DISABLE": "1"}, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    names = MAIN + ABLATIONS + CLUSTERS + SFT + ["released_rules", "ws_g2", "ws_grpo"]
    for n in names:
        d = tmp_path / n / "s0"
        steps = [json.loads(x) for x in open(d / "log.jsonl") if '"eval"' not in x]
        assert [r["step"] for r in steps] == [0], n
        summary = json.load(open(d / "summary.json"))
        assert summary["steps"] == 1 and summary["cfg"]["preset"] == "cpu", n
        assert summary["cfg"]["env"] == ("webshop" if n.startswith("ws_") else "alfworld"), n
    again = sh("--cpu", "--smoke", env={"RUN_ROOT": str(tmp_path)})  # complete runs are skipped: resumable
    assert again.returncode == 0 and again.stdout.count("[run_all] done already:") == len(names)


def test_readme_toy_table_is_rebuilt_from_results():
    """The README's toy table is exactly what `python eval.py table results/cpu` prints from the kept summaries."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    start, end = "<!-- toy-table: python eval.py table results/cpu -->", "<!-- /toy-table -->"
    assert start in readme and end in readme
    block = readme.split(start)[1].split(end)[0].strip()
    p = subprocess.run(["python", "eval.py", "table", "results/cpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert block == p.stdout.strip()

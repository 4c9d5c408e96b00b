"""Every number of Config carries its range beside its help (config.F's third argument), and one check
reads them all (config.check_ranges): below, at and above each declared bound, a value is taken or refused in
one line that names the flag, the value and the range. The bounds are read from the declarations; what each
must be is checked by hand on a few (formerly silent cases) and by the presets and methods all loading."""
import dataclasses
import math
import os
import subprocess
import sys

import pytest

from config import BUDGET, METHODS, PRESET_DIR, Config, check_ranges, get_config, parse_range

NUMERIC = [f for f in dataclasses.fields(Config) if type(f.default) in (int, float)]


def test_every_number_declares_a_range():
    assert NUMERIC and all("range" in f.metadata for f in NUMERIC), \
        [f.name for f in NUMERIC if "range" not in f.metadata]
    assert parse_range("[0, 1)") == (0.0, 1.0, True, False)
    assert parse_range("(0, inf)") == (0, math.inf, False, False)


def cases():
    """(flag, value, taken?) below, at and above each finite bound of each number."""
    out = []
    for f in NUMERIC:
        lo, hi, lo_in, hi_in = parse_range(f.metadata["range"])
        step = 1 if type(f.default) is int else 1e-3
        cast = int if type(f.default) is int else float
        for b, inside in ((lo, lo_in), (hi, hi_in)):
            if math.isinf(b):
                continue
            out.append((f.name, cast(b), inside))
            out.append((f.name, cast(b - step), b == hi and (b - step > lo or lo_in and b - step == lo)))
            out.append((f.name, cast(b + step), b == lo and (b + step < hi or hi_in and b + step == hi)))
    return out


@pytest.mark.parametrize("name,value,taken", cases())
def test_below_at_and_above_each_bound(name, value, taken):
    cfg = Config(**{name: value})
    if taken:
        check_ranges(cfg)
        return
    with pytest.raises(ValueError) as e:
        check_ranges(cfg)
    msg = str(e.value)
    spec = next(f.metadata["range"] for f in NUMERIC if f.name == name)
    assert "\n" not in msg and msg.startswith(f"--{name} {value:g}: out of range") and spec in msg, msg


def test_infinity_is_out_of_an_open_range():
    with pytest.raises(ValueError, match=r"--lr inf: out of range, expected a value in \(0, 1\]"):
        check_ranges(Config(lr=math.inf))
    with pytest.raises(ValueError, match=r"--vllm_kv_gb inf"):  # (-inf, inf): any finite value
        check_ranges(Config(vllm_kv_gb=math.inf))
    check_ranges(Config(vllm_kv_gb=-3.0))


def test_the_declared_ranges_admit_every_preset_and_method():
    for p in sorted(os.listdir(PRESET_DIR)):
        if p.endswith(".py"):
            get_config(["--preset", p[:-3]])
    for flags in [f for _, f in METHODS.values()] + list(BUDGET.values()):
        get_config(flags.split())


@pytest.mark.parametrize("args,words", [
    (["--alpha", "2"], "--alpha 2: out of range, expected a value in [0, 1]"),
    (["--micro_batch", "0"], "--micro_batch 0: out of range, expected a value in [1, inf)"),
    (["--seed", "-1"], "--seed -1: out of range, expected a value in [0, 2147483647]"),
])
def test_train_py_says_it_in_one_line(args, words):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "train.py", *args], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == f"error: {words}", p.stderr[-500:]

#!/usr/bin/env bash
# run_all.sh: the paper grid (every scheduler, ablation and seed) and a CPU toy grid.
# NOT BUILT YET (a later issue). Until then, run single configurations with train.py, e.g.
#   python train.py --scheduler none
#   torchrun --standalone --nproc_per_node=8 train.py --preset paper --scheduler linear
echo "run_all.sh: not built yet (see README); use train.py directly" >&2
exit 1

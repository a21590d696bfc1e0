#!/usr/bin/env bash
# The foundation issue's GPU checks as one script, for a session that is lent a CUDA device:
#   1. the token-exact oracle with the engine on CUDA in fp32 (transformers runs on the CPU as the reference);
#   2. engine throughput against transformers on the same GPU, fp32 and bf16 (bf16 prints greedy agreement
#      instead of exact ids);
#   3. the mixture-of-experts layer in bf16: grouped GEMMs against one matmul per expert;
#   4. every architecture in bf16 on CUDA against transformers in bf16 on CUDA (greedy agreement, logprob gap):
#      GPT-OSS's sinks, DeepSeek-V3's latent attention and the sigmoid routers have only run on the CPU.
# Results go to $OUT (the device tool's output folder) or ./gpu-results. Not yet run: no device was lent to
# the session that wrote it, so expect to fix small things on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpu.txt"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
fi
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'this torch has no CUDA'; print(torch.__version__)"
SEAWALL_TEST_DEVICE=cuda .venv/bin/python -m pytest -q -m oracle tests/seawall/offline/test_oracle.py \
  tests/engine/test_sampler.py 2>&1 | tee "$out/oracle_cuda.txt"
for dtype in float32 bfloat16; do
  .venv/bin/python bench/engine_throughput.py --device cuda --dtype "$dtype" --preset small \
    --json "$out/throughput_$dtype.json" 2>&1 | tee "$out/throughput_$dtype.txt"
done
# 3. the mixture-of-experts layer at Qwen3-30B-A3B's width: grouped GEMMs against one matmul per expert.
.venv/bin/python bench/moe_layer.py --device cuda --dtype bfloat16 --hidden 2048 --expert-width 768 \
  2>&1 | tee "$out/moe_layer.txt"
# 4. every architecture in bf16 against transformers in bf16, both on the GPU.
.venv/bin/python bench/architectures_device.py --device cuda --dtype bfloat16 2>&1 | tee "$out/architectures_bf16.txt"

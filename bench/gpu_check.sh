#!/usr/bin/env bash
# The GPU checks as one script, for a session that is lent a CUDA device:
#   bench/gpu_check.sh correctness   side by side, each bounded:
#     - the token-exact oracle with the engine on CUDA in fp32 (transformers on the CPU as the reference);
#     - every architecture on CUDA against transformers on CUDA, in fp32 (expect every token to agree) and
#       in bf16 (agreement and logprob gap, to read against the CPU's bf16 run in bench/README.md);
#     - the mesh oracle with its workers on CUDA in fp32 (GPU workers step on their own thread; without NIXL
#       installed KV moves over the gRPC fallback);
#   bench/gpu_check.sh speed         one at a time: the mesh's overhead against the in-process engine (GPU
#     workers, the tiny model); engine throughput against transformers on the same GPU (small preset, bf16
#     and fp32); the mixture-of-experts layer in bf16 (grouped GEMMs against one matmul per expert) at
#     Qwen3-30B-A3B's width;
#   bench/gpu_check.sh mesh          the mesh's overhead at length: fp32 (outputs must be identical), multi-step
#     decoding (what run-batch does by default), and the small preset;
#   bench/gpu_check.sh defaults      the GPU defaults against the CPU's: worker steps on their own thread vs
#     the event-loop thread, planning ahead of every step (all) vs only behind prompt chunks (known);
#   bench/gpu_check.sh architectures  the architectures in $GPU_CHECK_CASES (default: all) in fp32 and bf16,
#     and the embeddings API with its workers on CUDA: for architectures added since the last full run;
#   bench/gpu_check.sh all           correctness and speed.
# Python: .venv where it exists, else the machine's python3. Packages it lacks may travel as wheels in .whl/
# (the device tool's machines reach no registry; bench/README.md "On a GPU" says which); they are installed
# into a private directory that takes precedence over the machine's own.
# Results go to $OUT (the device tool's output folder, which takes back 8 files) or ./gpu-results.
# GPU_CHECK_DEVICE=cpu dry-runs the script here (slowly).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
summary="$out/summary.txt"
part="${1:-all}"
device="${GPU_CHECK_DEVICE:-cuda}"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 TRANSFORMERS_VERBOSITY=error
if [ "$py" = python3 ] && [ -d .whl ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/seawall-site \
    .whl/*.whl || { echo "installing .whl/ failed"; exit 1; }
  export PYTHONPATH="/tmp/seawall-site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi -L
  $py -c "import sys, torch, transformers, grpc, google.protobuf as pb; print(sys.version.split()[0], 'torch',
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'transformers', transformers.__version__,
'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
  echo "$(nproc) CPUs, part $part, device $device"
} 2>&1 | tee "$summary"

# step NAME SECONDS THREADS CMD...: runs CMD bounded, its output in $out/NAME.txt, a line in the summary.
step() {
  local name=$1 limit=$2 threads=$3 start rc
  shift 3
  start=$(date +%s)
  OMP_NUM_THREADS=$threads timeout -k 10 "$limit" "$@" > "$out/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$summary"
}

if [ "$part" = correctness ] || [ "$part" = all ]; then
  step oracle_cuda 250 4 env SEAWALL_TEST_DEVICE=$device $py -m pytest -q -p no:cacheprovider -m oracle \
    tests/seawall/offline/test_oracle.py tests/engine/test_sampler.py &
  step mesh_cuda 250 4 env SEAWALL_TEST_DEVICE=$device $py -m pytest -q -p no:cacheprovider \
    tests/e2e/test_mesh_oracle.py &
  step architectures_fp32 250 2 $py bench/architectures_device.py --device $device --dtype float32 &
  step architectures_bf16 250 2 $py bench/architectures_device.py --device $device --dtype bfloat16 &
  wait
fi
if [ "$part" = speed ] || [ "$part" = all ]; then
  # The mesh issue's overhead target (colocated mesh within 10% of the in-process engine), with a GPU worker
  # and cores to spare: on the 2-core CI box the tiny model misses it (bench/README.md "Mesh overhead").
  step mesh_overhead 120 8 $py bench/mesh_overhead.py --repeats 3
  step throughput_bfloat16 120 8 $py bench/engine_throughput.py --device $device --dtype bfloat16 --preset small
  step moe_layer 60 8 $py bench/moe_layer.py --device $device --dtype bfloat16 --hidden 2048 --expert-width 768
  step throughput_float32 120 8 $py bench/engine_throughput.py --device $device --dtype float32 --preset small
fi
if [ "$part" = mesh ]; then
  step mesh_overhead_fp32 130 8 $py bench/mesh_overhead.py --repeats 7 --dtype float32
  step mesh_overhead_steps8 130 8 $py bench/mesh_overhead.py --repeats 5 --decode-steps 8 --dtype float32
  step mesh_overhead_small 130 8 $py bench/mesh_overhead.py --repeats 5 --preset small --dtype float32
fi
if [ "$part" = architectures ]; then
  cases=(--cases "${GPU_CHECK_CASES:-$($py -c 'from tests.engine.test_architectures import CASES; print(",".join(CASES))')}")
  step architectures_fp32 200 2 $py bench/architectures_device.py --device $device --dtype float32 "${cases[@]}" &
  step architectures_bf16 200 2 $py bench/architectures_device.py --device $device --dtype bfloat16 "${cases[@]}" &
  step embeddings_cuda 200 4 env SEAWALL_TEST_DEVICE=$device $py -m pytest -q -p no:cacheprovider \
    tests/e2e/test_embeddings_mesh.py &
  wait
fi
if [ "$part" = defaults ]; then
  two=(--systems in-process,mesh-colocated --repeats 5 --dtype float32)
  step step_thread_own 90 8 $py bench/mesh_overhead.py "${two[@]}" --step-thread own --step-pipelining all
  step step_thread_loop 90 8 $py bench/mesh_overhead.py "${two[@]}" --step-thread loop --step-pipelining all
  step pipelining_known 90 8 $py bench/mesh_overhead.py "${two[@]}" --step-thread own --step-pipelining known
  step pipelining_prompts 90 8 $py bench/mesh_overhead.py "${two[@]}" --step-thread own --step-pipelining prompts
fi
cat "$summary"

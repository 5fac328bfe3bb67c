#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one go (docs/cuda.md, "What is verified where"):
#   1. every fused kernel against its numpy reference (tests/test_fused_kernels_gpu.py), and the
#      cuBLAS batched products on strided views against numpy (tests/test_cublas_plan.py);
#   2. the device-aware tests with ENGINE_TEST_DEVICE=cuda: every op forward and backward against
#      PyTorch on the GPU, the optimizers, clipping, the device model, the error paths, the
#      torch-compat functions, RNN/LSTM/GRU (packed too) and the distributions;
#   3. GPT-2, BERT, ViT and Swin trained through tools/train_net.py on the GPU against the CPU, and in
#      nn.Graph mode and with train.cuda_graph.enabled against eager on the GPU;
#   4. tools/benchmarks/gpu_gpt2.py: GPT-2 124M, seq 1024, fp16 (bench32: fp32), against PyTorch eager;
#      profile: where the engine's fp16 step spends its time (tools/benchmarks/gpu_profile.py);
#      attention: the attention core and its batched products (tools/benchmarks/gpu_attention.py);
#      elementwise: the memory-bound calls of the step against the copy bandwidth, CuPy's beside
#      the engine's kernels (tools/benchmarks/gpu_elementwise.py);
#      graph: the benchmark with the engine's forward + backward replayed as a CUDA graph;
#      dropout: the benchmark with dropout 0.1 in both models (flash attention's dropout), eager and
#      with the CUDA graph (each replay draws new numbers);
#      attn32: the benchmark with the engine's attention computed in float32 (the path before cuBLAS);
#      unfused: the CUDA-graph benchmark with the unfused attention core (cuBLAS + fused softmax;
#      the others run the default, flash attention: engine.ops.attention.FLASH_ATTENTION_ON_GPU);
#      flashattn: the flash kernels alone against PyTorch's SDPA and the unfused core
#      (tools/benchmarks/gpu_flash.py: GPT-2's shape, then with dropout 0.1, then head size 128;
#      the split backward and the fused one, where it exists, side by side);
#      fusedbwd: the CUDA-graph benchmark with the fused flash backward (--flash-backward fused).
#   BENCH_ARGS adds arguments to every benchmark run (e.g. "--micro-batch 16").
# Usage: tools/gpu_checks.sh [LOG_DIR] [STEPS...]   (STEPS: kernels suite train bench bench32
# profile attention elementwise graph dropout attn32 unfused flashattn fusedbwd; default kernels suite
# train bench)
# Each step has a time limit (GPU_CHECK_LIMIT_S, default 240 s) and logs to LOG_DIR/<step>.log;
# the summary at the end says which passed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-gpu_checks_logs}
shift || true
STEPS=${*:-kernels suite train bench}
BENCH_ARGS=${BENCH_ARGS:-}
LIMIT=${GPU_CHECK_LIMIT_S:-240}
WORKERS=${GPU_CHECK_WORKERS:-8}
PY=${PYTHON:-python3}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
summary=()

step() {  # name, command...
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*"
  timeout "$LIMIT" "$@" > "$LOG/$name.log" 2>&1
  rc=$?
  tail -n 25 "$LOG/$name.log"
  summary+=("$name: exit $rc in $((SECONDS - t0)) s")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import cupy, numpy, torch; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"

for s in $STEPS; do
  case $s in
    kernels) step kernels "$PY" -m pytest -q -n "$WORKERS" -p no:cacheprovider tests/test_fused_kernels_gpu.py \
               tests/test_cublas_plan.py tests/test_cuda_graphs.py ;;
    suite) step suite env ENGINE_TEST_DEVICE=cuda "$PY" -m pytest -q -n "$WORKERS" -p no:cacheprovider \
             tests/ops/test_parity.py tests/test_optim.py tests/test_clip_grad.py tests/test_nn_ops_errors.py \
             tests/test_indexing_errors.py tests/test_cuda_device_model.py tests/test_torch_compat_ops.py \
             tests/test_nn_rnn.py tests/test_distributions.py ;;
    train) step train "$PY" -m pytest -q -n "$WORKERS" -p no:cacheprovider tests/test_cuda_double_training.py \
             tests/graph/test_graph_training.py -k real_gpu ;;
    bench) step bench_fp16 "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    graph) step bench_fp16_graph "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --cuda-graph \
             --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    dropout) step bench_fp16_dropout "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --dropout 0.1 \
               --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS
             step bench_fp16_dropout_graph "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --dropout 0.1 --cuda-graph \
               --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    attn32) step bench_fp16_attn32 "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --attention float32 \
              --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    unfused) step bench_fp16_unfused_graph "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --attention auto \
               --cuda-graph --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    fusedbwd) step bench_fp16_graph_fused_bwd "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp16 --cuda-graph \
                --flash-backward fused --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    flashattn) for args in "" "--dropout 0.1" "--head-size 128 --heads 6"; do
                 step "flashattn${args//[^a-z0-9.]/_}" "$PY" tools/benchmarks/gpu_flash.py $args --json "$LOG/gpu_flash.jsonl"
               done ;;
    profile) step profile_fp16 "$PY" tools/benchmarks/gpu_profile.py --dtype fp16 ;;
    attention) step attention "$PY" tools/benchmarks/gpu_attention.py ;;
    elementwise) step elementwise "$PY" tools/benchmarks/gpu_elementwise.py ;;
    bench32) step bench_fp32 "$PY" tools/benchmarks/gpu_gpt2.py --dtype fp32 --json "$LOG/gpu_gpt2.jsonl" $BENCH_ARGS ;;
    *) echo "unknown step $s (kernels suite train bench bench32 profile attention elementwise graph dropout attn32 unfused"
       echo "flashattn fusedbwd)"
       exit 2 ;;
  esac
done
printf '%s\n' "${summary[@]}"

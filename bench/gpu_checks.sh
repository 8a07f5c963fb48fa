#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one command that ends within 8 minutes on one GPU, the checks first:
# the CUDA tests, torchrun with NCCL killed and resumed, the Train tab's ViT-B/16 fine-tune of 243 photos, the
# app on CUDA against the CPU with where its time goes (bench.app_budget), every map's cost, ViT-B/16 bf16
# training throughput against timm; then the CIFAR-10 speedrun (bench.speedrun: cifar10_speedrun_gpu, SEEDS) and,
# with what is left, the training-speed ablation (bench.mfu_ablation: every switch with its loss curve).
#
#   bash bench/gpu_checks.sh                                  # where requirements.txt is installed (PYTHON=...)
#   WHEELS=.whl bash bench/gpu_checks.sh                     # a CUDA image without network: bench/gpu_wheels.txt
#   STEPS="speedrun mfu_ablation" bash bench/gpu_checks.sh   # only these steps (names as in the summary)
#
# Everything goes to $OUT/gpu_checks.log (OUT defaults to runs/gpu), each step's exit status to $OUT/summary.txt,
# and the summary table ends the log. A step that fails or runs past its time limit is recorded and the next one
# runs; no step starts or runs past DEADLINE seconds (default 470) from the start, so that the whole ends within 8
# minutes. The Train tab's photos come from TRAIN_PHOTOS (default ../shared/data/photos/ants_and_bees/train), the
# speedrun's CIFAR-10 from VIT_DATA (default ../shared/data; copy them into the checkout where that folder does not
# travel). The compiler's cache is TORCHINDUCTOR_CACHE_DIR (default runs/inductor_cache): a second call on a machine
# that stays up finds max-autotune's choices made.
# DEVICE=cpu runs the same steps without a GPU (a dry run of the script itself; the CUDA tests skip, the ablation
# runs its tiny CPU model and the speedrun a few steps of its recipe).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-470}
DEVICE=${DEVICE:-cuda}
TRAIN_PHOTOS=${TRAIN_PHOTOS:-../shared/data/photos/ants_and_bees/train}  # the Train tab's timing (243 photos)
TRAIN_MODEL=${TRAIN_MODEL:-vit_base_patch16_224}
SEEDS=${SEEDS:-0 1 2}  # the speedrun's seeds (as many as fit before its deadline)
# CURVE_STEPS: the ablation's loss-curve length (its default: 200 on CUDA, 50 on a CPU)
STEPS=${STEPS:-}  # empty: every step
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/runs/inductor_cache}
mkdir -p "$OUT"
LOG=$OUT/gpu_checks.log
: >"$LOG"
: >"$OUT/summary.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_site "$WHEELS"/*.whl \
    || { echo "installing $WHEELS failed" | tee -a "$OUT/summary.txt"; exit 1; }
  export PYTHONPATH=$PYTHONPATH:/tmp/gpu_site
fi

step() {  # step NAME SECONDS COMMAND...: run COMMAND with a time limit, its output into the log
  local name=$1 limit=$2 t0=$SECONDS left=$((DEADLINE - SECONDS))
  shift 2
  if [ -n "$STEPS" ] && [[ " $STEPS " != *" $name "* ]]; then
    return
  fi
  if [ "$left" -lt 15 ]; then
    echo "$name: skipped, the deadline ($DEADLINE s) is reached" | tee -a "$OUT/summary.txt" "$LOG"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "===== $name: $*" | tee -a "$LOG"
  timeout --kill-after 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit $rc after $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo " (time limit $limit s)")" | tee -a "$OUT/summary.txt" "$LOG"
}

devices=cpu
[ "$DEVICE" = cuda ] && devices="cpu cuda"
step environment 60 "$PY" -c "
import torch, timm, gradio
print('torch', torch.__version__, 'timm', timm.__version__, 'gradio', gradio.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')
print('nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'cpus', torch.get_num_threads())"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
step cuda_tests 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_lrp.py -k cuda -rs
step torchrun 120 "$PY" -m bench.torchrun_resume --device "$DEVICE"
if [ -d "$TRAIN_PHOTOS" ]; then
  step train_tab 120 "$PY" -m bench.train_tab_speed --data "$TRAIN_PHOTOS" --model "$TRAIN_MODEL" --device "$DEVICE"
else
  echo "train_tab: skipped, no photos at $TRAIN_PHOTOS (TRAIN_PHOTOS=...)" | tee -a "$OUT/summary.txt" "$LOG"
fi
step app_bundled 120 "$PY" -m bench.bench_app --device $devices --repeats 10
"$PY" -c "import vit_core; vit_core.save_pretrained(vit_core.create_model('vit_base_patch16_224'), '/tmp/gpu_b16')"
step app_b16 90 "$PY" -m bench.bench_app --model /tmp/gpu_b16 --device "$DEVICE" --repeats 5
step map_costs 60 "$PY" -m bench.bench_explain --costs bundled vit_base_patch16_224 --device "$DEVICE"
step train_throughput 60 "$PY" -m bench.bench_model --device "$DEVICE"
speedrun_data=$("$PY" -c "from vit_core.data import default_data_root as r; print(r() / 'cifar10')")
if [ "$DEVICE" = cuda ] && [ -d "$speedrun_data" ]; then  # seeds that end while 150 s are left for the ablation
  step speedrun 330 "$PY" -m bench.speedrun --seeds $SEEDS --deadline $((DEADLINE - SECONDS - 150)) --out "$OUT/speedrun"
elif [ -d "$speedrun_data" ]; then  # a CPU: the recipe for a few steps
  step speedrun 120 "$PY" -m bench.speedrun --seeds 0 --out "$OUT/speedrun" --set device=cpu --set compile=false \
    --set train_subset=256 --set eval_subset=256 --set batch_size=128 --set micro_batch=64 --set epochs=2 --set warmup_epochs=0.5
else
  echo "speedrun: skipped, no CIFAR-10 at $speedrun_data (VIT_DATA=...)" | tee -a "$OUT/summary.txt" "$LOG"
fi
# what is left: the training-speed switches, autotuning last (its cache kept for the next call)
step mfu_ablation 400 "$PY" -m bench.mfu_ablation --device "$DEVICE" --deadline $((DEADLINE - SECONDS - 100)) \
  --inductor-cache "${TORCHINDUCTOR_CACHE_DIR#"$PWD"/}" ${CURVE_STEPS:+--curve-steps $CURVE_STEPS}
echo "===== summary" | tee -a "$LOG"
{
  echo "| step | result | seconds |"
  echo "|---|---|---:|"
  sed -E 's/^([^:]+): exit ([0-9]+) after ([0-9]+) s(.*)$/| \1 | exit \2\4 | \3 |/; t; s/^([^:]+): (.*)$/| \1 | \2 | |/' "$OUT/summary.txt"
  echo "| total | | $SECONDS |"
} | tee -a "$LOG"

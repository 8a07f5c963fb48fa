#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one command that ends within 8 minutes on one GPU, the checks first:
# the CUDA tests, torchrun with NCCL killed and resumed, the Train tab's ViT-B/16 fine-tune of 243 photos, the
# app on CUDA against the CPU with where its time goes (bench.app_budget), every map's cost, ViT-B/16 bf16
# training throughput against timm; then, with what is left, the training-speed ablation (bench.mfu_ablation:
# fused AdamW, bf16 weights, torch.compile modes, loss curves).
#
#   bash bench/gpu_checks.sh                                  # where requirements.txt is installed (PYTHON=...)
#   WHEELS=.whl bash bench/gpu_checks.sh                     # a CUDA image without network: bench/gpu_wheels.txt
#
# Everything goes to $OUT/gpu_checks.log (OUT defaults to runs/gpu), each step's exit status to $OUT/summary.txt.
# A step that fails or runs past its time limit is recorded and the next one runs; no step starts or runs past
# DEADLINE seconds (default 470) from the start, so that the whole ends within 8 minutes. The Train tab's photos
# come from TRAIN_PHOTOS (default ../shared/data/photos/ants_and_bees/train; copy them into the checkout where
# that folder does not travel).
# DEVICE=cpu runs the same steps without a GPU (a dry run of the script itself; the CUDA tests skip).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-470}
DEVICE=${DEVICE:-cuda}
TRAIN_PHOTOS=${TRAIN_PHOTOS:-../shared/data/photos/ants_and_bees/train}  # the Train tab's timing (243 photos)
TRAIN_MODEL=${TRAIN_MODEL:-vit_base_patch16_224}
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
if [ "$DEVICE" = cuda ]; then  # what is left: the training-speed switches, most compilation last
  step mfu_ablation 400 "$PY" -m bench.mfu_ablation --deadline $((DEADLINE - SECONDS - 100))
fi
echo "===== summary" | tee -a "$LOG"
cat "$OUT/summary.txt" | tee -a "$LOG"

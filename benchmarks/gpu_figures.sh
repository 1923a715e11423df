#!/usr/bin/env bash
# The GPU figures of the closing notes, in one go, on a machine with NVIDIA GPUs and Python but no
# pyopencl (the lent H200 hosts): wheels carried in .whl/ (pyopencl and its dependencies, and isal: without it
# the .pftrace compresses with zlib, as no install from PyPI does), the C extensions built there.
#   bash benchmarks/gpu_figures.sh OUTDIR [steps...]     steps: setup devices pipeline noreaper fallback diag sweep stamps clock multi tune perfetto read
set -uo pipefail
out=${1:?OUTDIR}; shift
steps=${*:-setup devices pipeline perfetto read fallback clock multi tune}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CLTRACE_DEVICE=${CLTRACE_DEVICE:-gpu} PYTHONPATH=$PWD/src:/tmp/site
[ -d /tmp/site/pyopencl ] || [[ " $steps " == *" setup "* ]] || steps="setup $steps"  # a fresh machine
for step in $steps; do
  echo "=== $step"
  case $step in
    setup)
      mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      python3 setup.py -q build_ext --inplace 2>&1 | tail -3 ;;
    devices) python3 -m cltrace devices --samples 16 ;;
    pipeline) python3 benchmarks/bench_pipeline.py --launches 200000 --rounds 3 --capacity-spans 200000 --stall-s 1 2>&1 | tee "$out/pipeline.txt" ;;
    noreaper) CLTRACE_REAPER=0 python3 benchmarks/bench_pipeline.py --launches 200000 --rounds 3 --capacity-spans 200000 --stall-s 1 2>&1 | tee "$out/pipeline-noreaper.txt" ;;
    fallback) CLTRACE_NATIVE=0 python3 benchmarks/bench_pipeline.py --launches 100000 --rounds 2 --capacity-spans 100000 --stall-s 1 --stall-trials 3 2>&1 | tee "$out/pipeline-fallback.txt" ;;
    stamps) python3 benchmarks/bench_stamps.py 2>&1 | tail -20 | tee "$out/stamps.txt" ;;
    clock) python3 benchmarks/clock_proof.py --seconds 10 --launches 2000 2>&1 | tail -8 | tee "$out/clock.txt" ;;
    multi) python3 benchmarks/multi_gpu_proof.py "$out/mgpu" 2>&1 | tail -40 | tee "$out/multi.txt" ;;
    diag)
      for sw in default 0.5; do
        python3 benchmarks/bench_pipeline.py --only e2e,stall --launches 200000 --rounds 2 --stall-s 1 \
          $([ $sw = default ] || echo --switch-ms $sw) 2>&1 | tail -4 | tee -a "$out/diag.txt"
      done ;;
    sweep)
      for sw in 0 0.1 0.25 0.5 1; do
        echo "--- CLTRACE_SWITCH_MS=$sw"
        CLTRACE_SWITCH_MS=$sw python3 benchmarks/bench_pipeline.py --only e2e,stall --launches 200000 --rounds 2 --stall-s 1 2>&1 | tail -2
      done 2>&1 | tee "$out/sweep.txt" ;;
    tune) python3 benchmarks/tune_stability.py --size 2048 --hogs 0 2>&1 | tail -40 | tee "$out/tune.txt" ;;
    perfetto) python3 benchmarks/bench_perfetto.py --spans 200000 --repeat 3 2>&1 | tail -22 | tee "$out/perfetto.txt" ;;
    read)  # the readers (native scanner and general reader) on this machine's Python: a demo run read back both ways
      python3 -m cltrace demo --out "$out/demo" >/dev/null 2>&1
      for f in "$out"/demo/demo.json "$out"/demo/demo.pftrace; do
        python3 -X faulthandler -m cltrace summary "$f" 2>&1 | tail -2
        CLTRACE_NATIVE=0 python3 -X faulthandler -m cltrace summary "$f" 2>&1 | tail -1
      done | tee "$out/read.txt" ;;
  esac
done

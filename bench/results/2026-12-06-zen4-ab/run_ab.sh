#!/bin/bash
# Issue 42's before/after: the tree before this round's restructuring (7152ceb, the last
# commit of 2026-12-04) against HEAD, each bench run from its own tree's scripts and
# sources (PYTHONPATH), one venv, 2 threads, in ABBA order so that drift of the shared
# host falls on both. Each bench reports convengine against its peer (PyTorch or ONNX
# Runtime) in interleaved rounds inside the run; the ratios are what is compared.
# usage: run_ab.sh BASE_TREE HEAD_TREE OUTDIR
set -u
base=$1; head=$2; out=$3
mkdir -p "$out"
run() {  # tree label bench args...
  local tree=$1 label=$2 bench=$3; shift 3
  ( cd "$tree" && PYTHONPATH="$tree/src" OMP_NUM_THREADS=2 timeout 600 \
      python "bench/$bench" "$@" \
      > "$out/$bench.$label.txt" 2>&1 )
  echo "$(date -u +%H:%M:%S) $bench $label rc=$?"
}
for order in base head head2 base2; do
  case $order in base*) tree=$base ;; *) tree=$head ;; esac
  run "$tree" "$order" bench_onnx.py --models resnet50,mobilenet_v2 --kinds float,qdq \
      --batches 1 --rounds 5
  run "$tree" "$order" bench_models.py --models resnet50,mobilenet_v2 --batch 1 \
      --formats cl --modes infer,int8 --rounds 5 --json "$out/models.$order.json"
  run "$tree" "$order" bench_fp32.py --suite resnet50,mobilenet_v2 --batch 1 \
      --passes forward --rounds 5 --budget 2 --json "$out/fp32.$order.json"
done

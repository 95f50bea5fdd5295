#!/usr/bin/env bash
# Pre-registered probe (session 73): on TREC-50, does mining K=20 give stage two a larger gain over stage one than the
# default K=5? Judged on validation macro-F1 only (stage two's best over stage one's, mean of seeds 0-2); test never read.
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository: params.yaml, data.data_dir and data/raw as dvc repro reads them
T=".venv/bin/tqc"
OUT="$(realpath -m "${1:-/tmp/trec50-k-probe}")"  # scratch folder; the histories land in $OUT/s<seed>/*.csv
source scripts/trec50_probe_data.sh
for seed in 0 1 2; do
  prepare_seed $seed
  $T "${S[@]}" stage-one --data $W/validated --train $W/augmented/train.jsonl --warmup $W/warmup --out $W/stage_one --history $W/stage_one.csv
  for k in 5 20; do
    $T "${S[@]}" --set mine.k=$k mine --data $W/validated --train $W/augmented/train.jsonl --model $W/stage_one --out $W/negatives-k$k.jsonl --report $W/r/mining-k$k.json
    $T "${S[@]}" stage-two --data $W/validated --train $W/augmented/train.jsonl --negatives $W/negatives-k$k.jsonl --model $W/stage_one --out $W/stage_two-k$k --history $W/stage_two-k$k.csv
    rm -rf $W/stage_two-k$k  # the history holds what is judged; the weights are not needed
  done
  echo "seed $seed done $(date)"
done

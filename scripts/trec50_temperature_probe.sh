#!/usr/bin/env bash
# Pre-registered probe (session 74): on TREC-50, does stage one's temperature τ₁ = 0.05 or 0.2 raise stage one's
# validation macro-F1 over the default τ₁ = 0.1 by at least 1 point in the mean of seeds 0-2? Judged on validation
# alone (each history's best epoch, the checkpoint stage one keeps); test never read. The default's figures are the K
# probe's stage-one histories (reports/trec50-k-probe/seed*-stage_one.csv), made by the same commands: seed 0 is trained
# again here to check that they reproduce. Stage two, mining and test follow only for a τ that passes.
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository: params.yaml, data.data_dir and data/raw as dvc repro reads them
T=".venv/bin/tqc"
OUT="$(realpath -m "${1:-/tmp/trec50-temperature-probe}")"  # scratch folder; the histories land in $OUT/s<seed>/*.csv
source scripts/trec50_probe_data.sh
for seed in 0 1 2; do
  prepare_seed $seed
  temperatures="0.05 0.2"; [ $seed = 0 ] && temperatures="0.1 0.05 0.2"
  for t in $temperatures; do
    $T "${S[@]}" --set stage_one.temperature=$t stage-one --data $W/validated --train $W/augmented/train.jsonl --warmup $W/warmup --out $W/stage_one-t$t --history $W/stage_one-t$t.csv
    rm -rf $W/stage_one-t$t  # the history holds what is judged
  done
  echo "seed $seed done $(date)"
done

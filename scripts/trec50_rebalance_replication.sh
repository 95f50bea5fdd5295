#!/usr/bin/env bash
# Pre-registered replication (session 75) of the rebalancing follow-up (scripts/trec50_rebalance_count_probe.sh), whose
# +0.87 validation macro-F1 over seeds 0-2 was every seed positive but under its 1-point bar. Fixed before any of these
# runs: on seeds 3-9, the default (augment.rebalance=mean) against augment.rebalance=count with target_count=200, each
# seed's ADMC (the checkpoint stage two keeps) on validation macro-F1. The question: is the paired mean difference over
# the seven seeds at least +1.0 point, with at most two seeds negative? Only then is test scored, with
# `dvc exp run -S data.dataset=trec50 -S seed=S -S augment.rebalance=count -S augment.target_count=200` at seeds 0-9
# against the default's runs; otherwise rebalance: mean stays. Judged only once all seven seeds have run.
# Resumable: a (seed, variant) whose stage-two history is in $OUT is not trained again, so the histories kept in
# reports/trec50-rebalance-replication/ can be copied back into $OUT/s<seed>/ by a later session.
set -euo pipefail
cd "$(dirname "$0")/.."
T=".venv/bin/tqc"
OUT="$(realpath -m "${1:-/tmp/trec50-rebalance-replication}")"
source scripts/trec50_probe_data.sh
declare -A VARIANT=([mean]="" [count200]="--set augment.rebalance=count --set augment.target_count=200")
for seed in 3 4 5 6 7 8 9; do
  for v in mean count200; do
    [ -f "$OUT/s$seed/stage_two-$v.csv" ] && continue
    [ -d "$OUT/s$seed/validated" ] || prepare_seed $seed
    W=$OUT/s$seed; S=(--set data.dataset=trec50 --set seed=$seed --set tracking.enabled=false)
    V=(${VARIANT[$v]})
    $T "${S[@]}" "${V[@]}" augment --train $W/validated/train.jsonl --generated $W/validated/generated.jsonl --held-out $W/validated/validation.jsonl $W/validated/test.jsonl --catalog $W/validated/catalog.jsonl --out $W/augmented-$v/train.jsonl --report $W/r/augment-$v.json
    $T "${S[@]}" "${V[@]}" stage-one --data $W/validated --train $W/augmented-$v/train.jsonl --warmup $W/warmup --out $W/stage_one-$v --history $W/stage_one-$v.csv
    $T "${S[@]}" "${V[@]}" mine --data $W/validated --train $W/augmented-$v/train.jsonl --model $W/stage_one-$v --out $W/negatives-$v.jsonl --report $W/r/mining-$v.json
    $T "${S[@]}" "${V[@]}" stage-two --data $W/validated --train $W/augmented-$v/train.jsonl --negatives $W/negatives-$v.jsonl --model $W/stage_one-$v --out $W/stage_two-$v --history $W/stage_two-$v.csv.tmp
    mv $W/stage_two-$v.csv.tmp $W/stage_two-$v.csv  # whole or absent: the resume test above reads it
    rm -rf $W/stage_one-$v $W/stage_two-$v
    echo "seed $seed $v done $(date)"
  done
done

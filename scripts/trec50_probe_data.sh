# Sourced by the TREC-50 probe scripts: one seed's data and warm-up record, made by the stages' own commands as
# dvc repro runs them (tracking off). Sets S (the seed's --set options) and W (its scratch folder, $OUT/s<seed>).
# Needs T (the tqc command) and OUT.
prepare_seed() {
  local seed=$1
  W=$OUT/s$seed; mkdir -p "$W"
  S=(--set data.dataset=trec50 --set seed=$seed --set tracking.enabled=false)
  $T "${S[@]}" ingest --out $W/ingested --quarantine $W/q/ingest.jsonl --report $W/r/ingest.json
  $T "${S[@]}" validate --data $W/ingested --out $W/validated --quarantine $W/q/validate.jsonl --report $W/r/validation.json --docs $W/r/docs
  $T "${S[@]}" augment --train $W/validated/train.jsonl --generated $W/validated/generated.jsonl --held-out $W/validated/validation.jsonl $W/validated/test.jsonl --catalog $W/validated/catalog.jsonl --out $W/augmented/train.jsonl --report $W/r/augment.json
  $T "${S[@]}" warmup --data $W/validated --out $W/warmup --report $W/r/warmup.json --quarantine $W/q/warmup.jsonl
}

# ADMC's chain on one seed's data, as dvc repro runs it: stage-one, mine, stage-two. $1 names the variant (its outputs
# are $W/stage_one-$1, $W/negatives-$1.jsonl, $W/stage_two-$1 and their records), $2 is its training file, and the
# rest are extra options for all three commands (e.g. --set stage_one.batch_size=16). Needs T, S and W (prepare_seed).
admc_chain() {
  local tag=$1 train=$2; shift 2
  $T "${S[@]}" "$@" stage-one --data $W/validated --train $train --warmup $W/warmup --out $W/stage_one-$tag --history $W/stage_one-$tag.csv
  $T "${S[@]}" "$@" mine --data $W/validated --train $train --model $W/stage_one-$tag --out $W/negatives-$tag.jsonl --report $W/r/mining-$tag.json
  $T "${S[@]}" "$@" stage-two --data $W/validated --train $train --negatives $W/negatives-$tag.jsonl --model $W/stage_one-$tag --out $W/stage_two-$tag --history $W/stage_two-$tag.csv
}

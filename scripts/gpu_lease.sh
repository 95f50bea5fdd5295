#!/bin/bash
# One lease of a GPU box that has torch and transformers but not the pipeline's other tools (how the
# figures in reports/gpu/ and README's GPU bench row were made): unpack what travelled with the
# checkout in .devcarry/ (git-ignored: site.tar.xz = pydantic, faiss-cpu, ruamel.yaml and ruamel.yaml.clib for Python
# 3.12, params.yaml being read with ruamel since e1df917: unzip their cp312 wheels into one folder and tar it;
# minilm/ = the packaged MiniLM's folder with its weights as float16 safetensors, xz-compressed;
# prepared.tar.xz = `scripts/gpu_grid.py prepare`'s folder), then the GPU tests, the epochs
# benchmark, and grid cells until SECONDS_TOTAL is nearly up. Logs and results go to $OUT.
# usage: bash scripts/gpu_lease.sh SECONDS_TOTAL [scripts/gpu_grid.py train arguments...] [--and more train arguments...]
#        each "--and" starts another selection (its own --grid/--variant/--where/--done/--workers), trained side by
#        side with the others into its own folder, because one train's --variant and --where apply to all its grids;
#        each selection gives its own -B budget (and --seed, --code-version): nothing carries over between them
#        SKIP_TESTS=1 / SKIP_BENCH=1 leave those steps out
total=$1; shift
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/gpu-lease-out}; mkdir -p "$OUT"
mkdir -p /tmp/site && tar xJf .devcarry/site.tar.xz -C /tmp/site && tar xJf .devcarry/prepared.tar.xz -C /tmp || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/minilm && cp .devcarry/minilm/*.json .devcarry/minilm/vocab.txt /tmp/minilm/ && cp -r .devcarry/minilm/1_Pooling /tmp/minilm/
xz -dc .devcarry/minilm/model.fp16.safetensors.xz > /tmp/model.fp16.safetensors
python3 - <<'PY' || exit 1
from safetensors.torch import load_file, save_file
t = load_file("/tmp/model.fp16.safetensors")
save_file({k: v.float() if v.is_floating_point() else v for k, v in t.items()}, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
import torch, transformers, faiss, pydantic, ruamel.yaml
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "transformers", transformers.__version__,
      "faiss", faiss.__version__, "gpus for faiss", faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0, "pydantic", pydantic.__version__)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rA 2>&1 | tail -25 | tee $OUT/gpu_tests.log
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  d=/tmp/prepared/$(python3 -c "
import json; from scripts.gpu_grid import preparation_key; from tqc.config import load_params
index = json.load(open('/tmp/prepared/index.json'))
print(index[preparation_key(load_params('params.yaml', {'data': {'dataset': 'trec50'}}))])")
  python3 -m tqc.cli --set model.pretrained=/tmp/minilm --set tracking.enabled=false bench epochs --data $d/validated --train $d/augmented/train.jsonl --batch-size 32 --steps 60 2>&1 | grep -v "it/s" | tail -8 | tee $OUT/bench.log
fi
left=$(( total - SECONDS - 45 ))
echo "grid: $left s left"
train() {  # $1: this selection's folder; the rest: its train arguments
  local out=$1; shift
  python3 scripts/gpu_grid.py train --prepared /tmp/prepared --out "$out" --minutes $(python3 -c "print($left/60)") \
    -D model.pretrained=/tmp/minilm -D tracking.enabled=false "$@" 2>&1 | grep gpu_grid | sed "s|^|$(basename "$out") |"
}
selection=(); count=0
for arg in "$@" --and; do
  if [ "$arg" = --and ]; then train /tmp/grid$count "${selection[@]}" & count=$((count + 1)); selection=()
  else selection+=("$arg"); fi
done
wait
# every record on the box: a warm box keeps /tmp, so an earlier call's cells come back again (report and --done
# read records by cell name, so a repeat is harmless)
cat /tmp/grid*/results.jsonl > $OUT/results.jsonl 2>/dev/null
grep -h "done \|failed\|Error\|error" /tmp/grid*/worker*.log | tail -200 > $OUT/workers.log
grep -h -A30 "Traceback" /tmp/grid*/worker*.log | head -80
python3 - <<'PY'
import json
import os
for line in open(os.environ["OUT"] + "/results.jsonl"):  # exported above, with its default
    r = json.loads(line); f = r["figures"]
    print(f"{r['grid']:14s} {r['variant']:28s} s{r['seed']} ADMC {100*f['admc_macro_f1']:.2f} AC {100*f['ac_macro_f1']:.2f} acc {100*f['admc_accuracy']:.2f} {r['seconds']:.0f}s {r['epochs_trained']}")
PY

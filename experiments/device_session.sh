#!/usr/bin/env bash
# One session on a GPU machine: the cost model's operators timed, the CUDA path checked, and a
# measured GPU profile of the 8B shape.
#
# Here, first: python -m experiments.device_kit   (packs .device_kit/)
# Then, on the GPU machine, from the root of a checkout with .device_kit/ copied beside it:
#   bash experiments/device_session.sh            (about ten minutes)
#
# What it needs of the machine: an NVIDIA GPU, Python 3.12 with CUDA torch; no Hydra and no
# package registry are needed (the kit brings them), and no weights (the SmolLM2 package is
# larger than the kit is meant to be), so both models run with seeded random weights
# (model.random_weights=true): the tokens are noise, the timing is the shape's. In order, each step bounded so that the whole ends inside ten minutes:
#   1. experiments.op_table: one layer's operators of seven published model shapes at TP 1-8,
#      and attention, timed in the published tables' format (for experiments.gpu_check, back
#      here), packed into op_tables.tar.gz;
#   2. experiments.cuda_check on SmolLM2's shape (readback stream, windows, tokens vs CPU);
#   3. experiments.calibrate device=cuda dtype=bfloat16 on the 8B config shipped for the
#      analytic profiles, so the analytic H200 profile can be set against a measured one,
#      step for step, back here.
# What comes back ($OUT, at most 8 files): session.log, op_tables.tar.gz, cuda_check.json, the
# 8B profile and its timed steps (CSV).
set -u
OUT=${OUT:-device_out}
KIT=${KIT:-.device_kit}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}  # cpu: a dry run of this script on a machine without a GPU
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/session.log") 2>&1

step() {  # step SECONDS NAME COMMAND...: run one part, bounded, and say how it ended
    local limit=$1 name=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@"
    echo "== $name: exit $? after $((SECONDS - t0)) s"
}

if [ -z "${SKIP_INSTALL:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$KIT"/wheels/*.whl || exit 3
fi
# This checkout's code first; the kit's packages (and nanoserve's entry points) next.
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch, transformers, hydra; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

SMOL=(model=hf "model.path=$KIT/smollm2" model.random_weights=true)
EIGHT=(model=hf "model.path=$KIT/llama-8b" model.random_weights=true)
CAL=(--ungated --drift none --wait-budget 0 --passes 1 "device=$DEVICE" dtype=bfloat16)

OPS=(--out "$OUT/tables" --device "$DEVICE")
[ "$DEVICE" = cpu ] && OPS+=(--quick --models phi-2 --dtype float32)
[ "$DEVICE" = cpu ] || OPS+=(--models Llama-2-7b-hf Llama-2-70b-hf Qwen-72B \
    CodeLlama-34b-Instruct-hf Meta-Llama-3-8B internlm-20b phi-2)
if [ -z "${SKIP_OPS:-}" ]; then
    step 120 op_table "$PY" -m experiments.op_table "${OPS[@]}"
    tar -czf "$OUT/op_tables.tar.gz" -C "$OUT" tables && rm -rf "$OUT/tables"
fi
# (its CPU reference run skips the C++ decode kernel: its compiling takes long, and is not what
# this call is for)
step 80 cuda_check "$PY" -m experiments.cuda_check --out "$OUT" "${SMOL[@]}" \
    engine.paged_kernel=false
# (on an H200 it measured 24 of its 50 points in 320 s: it needs most of what is left)
step 400 "calibrate llama-8b" "$PY" -m experiments.calibrate "${CAL[@]}" "${EIGHT[@]}" \
    --out "$OUT/llama-8b-bfloat16-h200.yaml" --raw "$OUT/llama8b_steps.csv"
ls -la "$OUT"

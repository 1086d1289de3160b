#!/usr/bin/env bash
# One call on a lent GPU machine: the CUDA path checked, and two measured GPU profiles.
#
# Here, first: python -m experiments.device_kit   (packs .device_kit/)
# Then one device call, from the repository root:
#   command: bash experiments/device_session.sh     carry: [".device_kit"]     timeout_s: 590
#
# The device has Python 3.12 with CUDA torch but no Hydra and no registry, and the SmolLM2
# weights cannot travel (over the 64 MiB a call carries), so both models run with seeded
# random weights (model.random_weights=true): the tokens are noise, the timing is the
# shape's. In order, each step bounded so that the whole ends inside ten minutes:
#   1. experiments.cuda_check on SmolLM2's shape (readback stream, windows, tokens vs CPU);
#   2. experiments.calibrate device=cuda dtype=bfloat16 on SmolLM2's shape (one pass);
#   3. the same on the 8B config shipped for the analytic profiles, so the analytic H200
#      profile can be set against a measured one, step for step, back here.
# What comes back ($OUT, at most 8 files): session.log, cuda_check.json, the two profiles
# and their timed steps (CSV).
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
CAL=(--wait-budget 0 --passes 1 "device=$DEVICE" dtype=bfloat16)

# (its CPU reference run skips the C++ decode kernel: its compiling takes long, and is not what
# this call is for)
step 120 cuda_check "$PY" -m experiments.cuda_check --out "$OUT" "${SMOL[@]}" \
    engine.paged_kernel=false
step 190 "calibrate smollm2" "$PY" -m experiments.calibrate "${CAL[@]}" "${SMOL[@]}" \
    --out "$OUT/smollm2-bfloat16-h200.yaml" --raw "$OUT/smollm2_steps.csv"
step 220 "calibrate llama-8b" "$PY" -m experiments.calibrate "${CAL[@]}" "${EIGHT[@]}" \
    --out "$OUT/llama-8b-bfloat16-h200.yaml" --raw "$OUT/llama8b_steps.csv"
ls -la "$OUT"

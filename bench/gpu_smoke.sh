#!/usr/bin/env bash
# GPU smoke test of the launcher: 2 GRPO steps of verl 0.9.1 (vLLM server rollout, FSDP actor) on one GPU,
# through `verl-launcher head`, with a tiny randomly initialised Qwen2 model and a synthetic gsm8k-like
# dataset made locally (no model or data download).
#
# Usage: bench/gpu_smoke.sh            (needs one NVIDIA GPU; about 10-20 min with a cold install)
#        GPU_SMOKE_DRY_RUN=1 bench/gpu_smoke.sh   (no GPU: prepare everything and check the overrides
#                                                  against verl's own config code, then stop)
# Environment:
#   GPU_SMOKE_DIR      work directory (default /tmp/verl-gpu-smoke; keep it short: Ray socket paths)
#   GPU_SMOKE_VENV     virtualenv with verl[vllm]==0.9.1 (default $GPU_SMOKE_DIR/venv; created when missing)
#   GPU_SMOKE_WHEELS   directory of wheels preferred over the index (default <repo>/.whl, used when present)
#   GPU_SMOKE_OFFLINE  1: install from GPU_SMOKE_WHEELS only (machines without network)
#   GPU_SMOKE_TIMEOUT  seconds for the training run (default 1800)
#   PYTHON             interpreter used to create the virtualenv (default python3)
# Prints timings (install, prepare, run) and the VERL_PROGRESS lines; exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${GPU_SMOKE_DIR:-/tmp/verl-gpu-smoke}"
VENV="${GPU_SMOKE_VENV:-$WORK/venv}"
WHEELS="${GPU_SMOKE_WHEELS:-$ROOT/.whl}"
TIMEOUT="${GPU_SMOKE_TIMEOUT:-1800}"
DRY_RUN="${GPU_SMOKE_DRY_RUN:-0}"
PORT="${GPU_SMOKE_PORT:-6390}"
mkdir -p "$WORK"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
fail() { echo "gpu_smoke: FAILED: $*" >&2; exit 1; }

if [[ "$DRY_RUN" != 1 ]]; then
  command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU"
  nvidia-smi -L || fail "nvidia-smi -L failed"
fi

# 1. verl[vllm] 0.9.1 in its own virtualenv (local wheels first).
t0=$(now)
if ! "$VENV/bin/python" -c "import verl, vllm, ray" 2>/dev/null; then
  if [[ "$DRY_RUN" == 1 ]] && "$VENV/bin/python" -c "import verl, ray" 2>/dev/null; then
    :  # a dry run needs no vLLM
  else
    [[ -x "$VENV/bin/python" ]] || "${PYTHON:-python3}" -m venv "$VENV"
    pip_args=(install --quiet)
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
      pip_args+=(--find-links "$WHEELS")
      [[ "${GPU_SMOKE_OFFLINE:-0}" == 1 ]] && pip_args+=(--no-index)
    fi
    "$VENV/bin/python" -m pip "${pip_args[@]}" --upgrade pip
    "$VENV/bin/python" -m pip "${pip_args[@]}" "verl[vllm]==0.9.1"
  fi
fi
install_s=$(elapsed "$t0")
"$VENV/bin/python" -c "import verl; print('gpu_smoke: verl', verl.__version__)"

# 2. Model, data, launch spec (all local).
t0=$(now)
PREP=("$VENV/bin/python" "$ROOT/bench/gpu_smoke/prepare.py")
[[ -f "$WORK/model/config.json" ]] || "${PREP[@]}" model "$WORK/model"
[[ -f "$WORK/data/train.parquet" ]] || "${PREP[@]}" data "$WORK/data"
"${PREP[@]}" spec "$WORK/launch.json" --model "$WORK/model" --data "$WORK/data" --ckpt "$WORK/ckpt" \
  --port "$PORT" --python "$VENV/bin/python"
"${PREP[@]}" check "$WORK/launch.json"
prepare_s=$(elapsed "$t0")
if [[ "$DRY_RUN" == 1 ]]; then
  echo "gpu_smoke: dry run done (install ${install_s}s, prepare ${prepare_s}s); run without GPU_SMOKE_DRY_RUN on a GPU"
  exit 0
fi

# 3. Two GRPO steps through the launcher (the launcher is imported from this checkout).
t0=$(now)
rm -f "$WORK/progress.json" "$WORK/termination-log"
set +e
PYTHONPATH="$ROOT/launcher${PYTHONPATH:+:$PYTHONPATH}" \
VERL_LAUNCH_SPEC="$WORK/launch.json" \
VERL_OPERATOR_ROLE=head VERL_OPERATOR_ATTEMPT=0 \
VERL_LAUNCHER_TERMINATION_LOG="$WORK/termination-log" \
VERL_LAUNCHER_PROGRESS_FILE="$WORK/progress.json" \
  timeout "$TIMEOUT" "$VENV/bin/python" -m verl_launcher head \
    --ray-executable "$VENV/bin/ray" \
    --ray-start-arg="--temp-dir=$WORK/ray" \
    --ray-start-arg=--include-dashboard=false \
    2>&1 | tee "$WORK/head.log"
rc=${PIPESTATUS[0]}
set -e
run_s=$(elapsed "$t0")

echo "gpu_smoke: --- progress ---"
grep '^VERL_PROGRESS ' "$WORK/head.log" || true
echo "gpu_smoke: termination message: $(cat "$WORK/termination-log" 2>/dev/null || echo none)"
echo "gpu_smoke: install ${install_s}s, prepare ${prepare_s}s, launcher run ${run_s}s, exit ${rc}"
[[ "$rc" == 0 ]] || fail "verl-launcher head exited ${rc}"
step=$("$VENV/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" "$WORK/progress.json") \
  || fail "no progress file"
[[ "$step" -ge 2 ]] || fail "verl reached step ${step}, expected 2"
echo "gpu_smoke: OK (2 GRPO steps through verl-launcher)"

#!/usr/bin/env bash
# `make gpu-check`: the checks a lent GPU machine runs in one command, in under 8 minutes —
# the CUDA tests, then bench_full, bench_plan and bench_resnet. It runs the machine's own
# python3 (the one with CUDA's torch), not the CPU venv of `make install`. Wheels that machine
# lacks (tailkit itself for its entry points, pooch, platformdirs) are taken from .whl/ when
# present. Every step runs even if one fails; the exit status says whether all passed.
set -uo pipefail
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/tailkit-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/tailkit-site
fi
status=0
step() {
    local limit=$1
    shift
    echo "== $* (limit ${limit} s)"
    local start=$SECONDS
    timeout "$limit" "$@" || { echo "== FAILED ($?): $*"; status=1; }
    echo "== $((SECONDS - start)) s"
}
$PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name())' || exit 1
step 150 $PY -m pytest -q -p no:cacheprovider tests/training/test_cuda_graph.py tests/training/test_cuda_paths.py
step 120 $PY -m pytest -q -p no:cacheprovider -k cuda tests/plugins/test_losses.py \
    tests/plugins/test_embedding_losses.py tests/plugins/test_ldam_cb_losses.py tests/plugins/test_samplers.py \
    tests/evaluation/test_evaluation.py
step 60 $PY benchmarks/bench_full.py --device cuda
step 90 $PY benchmarks/bench_plan.py --device cuda
step 90 $PY benchmarks/bench_resnet.py --device cuda --epochs 3 --eval-epochs 3
exit $status

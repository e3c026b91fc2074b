#!/usr/bin/env bash
# Run the workflow on an air-gapped GPU node that has python3 + torch but no snakemake,
# from a wheelhouse made elsewhere with scripts/build_wheelhouse.py.
#   usage: scripts/offline_run.sh WHEELHOUSE_DIR [snakemake arguments...]
#   e.g.   scripts/offline_run.sh .whl --cores 16 --config device=h100 release_dir=/data/cuda-l1
set -euo pipefail
wheelhouse=${1:?usage: scripts/offline_run.sh WHEELHOUSE_DIR [snakemake args...]}
shift
site=${L1_SITE:-/tmp/l1bench-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheelhouse"/*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m snakemake "$@"

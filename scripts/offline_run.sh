#!/usr/bin/env bash
# Run the workflow on an air-gapped GPU node that has python3 + torch but no snakemake,
# from a wheelhouse made elsewhere with scripts/build_wheelhouse.py; the l1bench package is
# installed from this working tree (scripts/offline_install.sh).
#   usage: scripts/offline_run.sh WHEELHOUSE_DIR [snakemake arguments...]
#   e.g.   scripts/offline_run.sh .whl --cores 16 --config device=h100 release_dir=/data/cuda-l1
set -euo pipefail
wheelhouse=${1:?usage: scripts/offline_run.sh WHEELHOUSE_DIR [snakemake args...]}
shift
. "$(dirname "$0")/offline_install.sh" "$wheelhouse"
exec python3 -m snakemake "$@"

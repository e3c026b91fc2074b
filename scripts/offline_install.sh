#!/usr/bin/env bash
# Install, without network, what the workflow needs beyond python3 + torch into one folder: the
# wheelhouse (snakemake's closure, from scripts/build_wheelhouse.py), then this repository's
# l1bench package, built from the working tree by the setuptools the wheelhouse carries in
# build-tools/ (a wheelhouse without it: by the node's own, >= 64, which torch brings).
# Sourced, so that PYTHONPATH names the folder for everything that follows
# (snakemake, its jobs and their workers; SLURM jobs inherit it):
#   . scripts/offline_install.sh WHEELHOUSE_DIR      (folder: $L1_SITE, default /tmp/l1bench-site)
# scripts/offline_run.sh and lab/device_run.sh start with it.
site=${L1_SITE:-/tmp/l1bench-site}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheelhouse=${1:?usage: . scripts/offline_install.sh WHEELHOUSE_DIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheelhouse"/*.whl || return 1
if [ -d "$wheelhouse/build-tools" ]; then build=(--find-links "$wheelhouse/build-tools"); else build=(--no-build-isolation); fi
python3 -m pip install -q --no-index --no-deps "${build[@]}" --no-compile --no-cache-dir --upgrade \
    --target "$site" "$repo" || {
    echo "offline_install.sh: the l1bench package did not build from $repo (it needs setuptools >= 64 in python3)" >&2
    return 1
}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

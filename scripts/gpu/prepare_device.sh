#!/usr/bin/env bash
# Run on a machine with network access (no GPU needed), for a GPU node that has neither network nor a
# compiler (an air-gapped cluster node): put into .gpu/device (ignored by git) what the node needs and
# lacks, for scripts/gpu/on_device.sh to use there without any package index. Copy the checkout with
# .gpu/device to the node by whatever means it allows (rsync or scp through a gateway, removable media).
#
#   wheels/   CPython 3.12 manylinux x86-64 wheels of the project's runtime dependencies that the node's
#             Python does not have (scripts/gpu/device_image.txt), resolved by pip for that Python from
#             pyproject.toml and the sdist's own requirements, whatever is installed here
#             (scripts/gpu/device_wheels.py)
#   llama_cpp_cuda.tar.xz   llama-cpp-python built here with CUDA for the node (sm_90, CUDA 13), when
#             scripts/gpu/build_cuda_wheel.sh has made .gpu/cuda/llama_cpp_cuda.tar.xz (38.9 MiB):
#             on_device.sh unpacks it instead of building there (WASINN_CUDA_PACKAGE names another
#             file; empty: none)
#   llama_cpp_python-0.3.36.tar.gz   the pinned source distribution, slimmed (scripts/gpu/sdist.py), no patch,
#             which on_device.sh builds from (where the node has nvcc) when there is no prebuilt package or
#             it does not load; beside the prebuilt package only if both fit the size limit below, left out,
#             saying so, if not (at 64 MiB they do not: 38.9 + 8.8 MiB with the wheels' 19.4 and the tracked
#             files' 4.1)
#   MANIFEST  what is there, with sizes and sha256
#
# Size limit: the folder and the project's tracked files together must stay under WASINN_DEVICE_LIMIT_MIB
# (default 64, for a transfer that takes no more; 0: no limit, and the sdist always goes beside the
# prebuilt package); the script fails at the limit and prints the sizes.
#
#   scripts/gpu/prepare_device.sh [DIR]       (default .gpu/device; WASINN_DEVICE_PYTHON=3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.gpu/device}
python_version=${WASINN_DEVICE_PYTHON:-3.12}
cuda_package=${WASINN_CUDA_PACKAGE-.gpu/cuda/llama_cpp_cuda.tar.xz}
limit_mib=${WASINN_DEVICE_LIMIT_MIB:-64}
[[ $limit_mib =~ ^[0-9]+$ ]] || { echo "prepare_device: WASINN_DEVICE_LIMIT_MIB must be a whole number of MiB" >&2; exit 2; }
limit=$((limit_mib << 20))
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

sdist=$(python3 scripts/gpu/sdist.py fetch .gpu/cache)
rm -rf "$dir" && mkdir -p "$dir/wheels"
python3 scripts/gpu/device_wheels.py "$sdist" "$dir/wheels" --python-version "$python_version"
python3 scripts/gpu/sdist.py slim "$sdist" "$dir/$(basename "$sdist")"
if [[ -n $cuda_package && -f $cuda_package ]]; then
    cp "$cuda_package" "$dir/llama_cpp_cuda.tar.xz"
    echo "prepare_device: adding the prebuilt CUDA package $cuda_package (scripts/gpu/build_cuda_wheel.sh)"
    if ((limit && $(du -sb "$dir" | cut -f1) + tree >= limit)); then
        rm "$dir/$(basename "$sdist")"
        echo "prepare_device: the sdist left out (with it the folder would pass the $(mib "$limit") limit):" \
            "on_device.sh cannot fall back to building there (WASINN_DEVICE_LIMIT_MIB=0 keeps it)"
    fi
else
    echo "prepare_device: no prebuilt CUDA package ($cuda_package): on_device.sh builds from the sdist there"
fi

(cd "$dir" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2 | while read -r size path; do
    echo "$size $(sha256sum "$path" | cut -c1-64) ${path#./}"
done) >"$dir/MANIFEST"
folder=$(du -sb "$dir" | cut -f1)
cat "$dir/MANIFEST"
if ((limit)); then
    echo "prepare_device: $dir holds $(mib "$folder"); with the tracked files ($(mib "$tree")) $(mib $((folder + tree))) of the $(mib "$limit") limit"
else
    echo "prepare_device: $dir holds $(mib "$folder"); with the tracked files ($(mib "$tree")) $(mib $((folder + tree)))"
fi
if ((limit && folder + tree >= limit)); then
    echo "prepare_device: over the WASINN_DEVICE_LIMIT_MIB limit of $(mib "$limit")" >&2
    exit 1
fi

#!/usr/bin/env bash
# Run HERE (a machine that reaches the package registries): put into .gpu/device (ignored by git) what the
# lent GPU machine needs and lacks, for scripts/gpu/on_device.sh to use there without any index:
#
#   wheels/   CPython 3.12 manylinux x86-64 wheels of the project's runtime dependencies that the device's
#             image does not have (scripts/gpu/device_image.txt), resolved by pip for that Python from
#             pyproject.toml and the sdist's own requirements, whatever is installed here
#             (scripts/gpu/device_wheels.py)
#   llama_cpp_python-0.3.36.tar.gz   the pinned source distribution, slimmed (scripts/gpu/sdist.py), no patch
#   MANIFEST  what is there, with sizes and sha256
#
# A device call carries the working tree and the carried paths, 64 MiB in all: the script fails when the
# folder and the tracked files together reach that, and prints the sizes.
#
#   scripts/gpu/prepare_device.sh [DIR]       (default .gpu/device; WASINN_DEVICE_PYTHON=3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.gpu/device}
python_version=${WASINN_DEVICE_PYTHON:-3.12}
limit=$((64 << 20))

sdist=$(python3 scripts/gpu/sdist.py fetch .gpu/cache)
rm -rf "$dir" && mkdir -p "$dir/wheels"
python3 scripts/gpu/device_wheels.py "$sdist" "$dir/wheels" --python-version "$python_version"
python3 scripts/gpu/sdist.py slim "$sdist" "$dir/$(basename "$sdist")"

(cd "$dir" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2 | while read -r size path; do
    echo "$size $(sha256sum "$path" | cut -c1-64) ${path#./}"
done) >"$dir/MANIFEST"
folder=$(du -sb "$dir" | cut -f1)
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
cat "$dir/MANIFEST"
echo "prepare_device: $dir holds $(mib "$folder"); with the tracked files ($(mib "$tree")) a call carries $(mib $((folder + tree))) of $(mib "$limit")"
if ((folder + tree >= limit)); then
    echo "prepare_device: too large for one device call" >&2
    exit 1
fi

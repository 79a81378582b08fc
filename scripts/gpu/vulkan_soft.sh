#!/usr/bin/env bash
# A real ggml GPU backend on a machine without a GPU: llama.cpp's Vulkan backend on Mesa's software
# driver (lavapipe), then the GPU tests (pytest -m gpu) against it.
#
#   scripts/gpu/vulkan_soft.sh                 # install, build (once), run the GPU tests
#   scripts/gpu/vulkan_soft.sh --build-only    # install and build, no tests
#   scripts/gpu/vulkan_soft.sh -- -k fit       # extra arguments after -- go to pytest
#
# 1. Debian packages: glslc libvulkan-dev mesa-vulkan-drivers vulkan-tools spirv-headers (apt-get,
#    as root; skipped when all are installed). Without spirv-headers CMake stops at SPIRV-Headers.
# 2. llama-cpp-python 0.3.36 built with CMAKE_ARGS="-DGGML_VULKAN=on" from its source distribution,
#    slimmed and with the VK_EXT_layer_settings block of ggml-vulkan.cpp guarded (scripts/gpu/sdist.py;
#    Debian 12's Vulkan headers lack that extension), into its own virtual environment
#    .gpu/vulkan/venv (system site packages visible, so the project's other dependencies are the
#    machine's). The built wheel and the venv are cached under .gpu/ (ignored by git): a second run
#    skips the build (about 6 minutes on 2 cores) and takes seconds.
# 3. The tests: GGML_VK_VISIBLE_DEVICES=0 (ggml-vulkan skips CPU-type devices such as lavapipe
#    otherwise, and offload silently stays on the CPU); the two-device tests start their own
#    processes with GGML_VK_VISIBLE_DEVICES=0,0.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
gpu=${WASINN_GPU_DIR:-$root/.gpu}
build_only=0
if [[ ${1:-} == --build-only ]]; then build_only=1; shift; fi
[[ ${1:-} == -- ]] && shift

packages=(glslc libvulkan-dev mesa-vulkan-drivers vulkan-tools spirv-headers)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
    echo "vulkan_soft: installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

venv=$gpu/vulkan/venv
python=$venv/bin/python
sdist=$(python3 scripts/gpu/sdist.py fetch "$gpu/cache")
recipe=1  # bump when the build recipe (flags, the guard in sdist.py) changes: the cache is rebuilt
stamp="$(sha256sum "$sdist" | cut -c1-16)-$recipe"
if [[ ! -x $python || "$(cat "$venv/.wasinn-stamp" 2>/dev/null)" != "$stamp" ]]; then
    wheels=$gpu/vulkan/wheel-$stamp
    if ! compgen -G "$wheels/llama_cpp_python-*.whl" >/dev/null; then
        rm -rf "$gpu"/vulkan/wheel-* && mkdir -p "$wheels"
        slim=$gpu/vulkan/llama_cpp_python-0.3.36-vulkan.tar.gz
        python3 scripts/gpu/sdist.py slim "$sdist" "$slim" --vulkan-guard
        echo "vulkan_soft: building llama-cpp-python with -DGGML_VULKAN=on ($(nproc) cores)"
        start=$(date +%s)
        CMAKE_ARGS="-DGGML_VULKAN=on" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
            nice -n 10 python3 -m pip wheel --quiet --no-deps -w "$wheels" "$slim"
        echo "vulkan_soft: built in $(($(date +%s) - start)) s"
        rm -f "$slim"
    fi
    rm -rf "$venv"
    python3 -m venv --system-site-packages "$venv"
    "$python" -m pip install --quiet --no-deps --no-index --ignore-installed "$wheels"/llama_cpp_python-*.whl  # over the machine's CPU build
    echo "$stamp" >"$venv/.wasinn-stamp"
fi
echo "vulkan_soft: $("$python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "at", llama_cpp.__file__)')"
if ((build_only)); then exit 0; fi

export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
vulkaninfo --summary 2>/dev/null | grep -E "deviceName|apiVersion|deviceType" | head -3 || true
exec "$python" -m pytest -q -m gpu -p no:cacheprovider tests/gpu "$@"

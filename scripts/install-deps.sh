#!/usr/bin/env bash
# Install what zt needs to build and test on Debian 12+ / Ubuntu 22.04+. Safe to run again.
# The CUDA toolkit is optional: without it zt builds the CPU path only (see README).
#   --run   only what building and running zt needs (scripts/quickstart.sh): none of the tests'
#           references (PyTorch, transformers, peft, tensorboard, Chromium, the fuzzers' clang)
set -euo pipefail
tests=1
case "${1:-}" in
  "") ;;
  --run) tests=0 ;;
  *) echo "install-deps: unknown option '$1' (use --run for what running zt needs, nothing for the tests too)" >&2
     exit 2 ;;
esac

pkgs=(
  build-essential cmake ninja-build pkg-config git
  libjsmn-dev                         # JSON tokenizer used by the config and data readers
  libyaml-dev                         # YAML configs (MindFormers-style run.yaml)
  libsentencepiece-dev sentencepiece  # tokenizer library + spm_train/spm_encode used by the tests
  libopenmpi-dev openmpi-bin          # CPU ranks (multi-process tests)
  python3 python3-numpy python3-sentencepiece python3-yaml  # independent references in tests
)
if [ "$tests" = 1 ]; then
  pkgs+=(
    openssh-server openssh-client iproute2  # CPU ranks on two hosts: network namespaces with an sshd each
    clang libclang-rt-dev                   # libFuzzer targets
    chromium                                # headless browser: tests/report renders zt-report's page in it
  )
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} Debian packages already installed"
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python modules some tests use as independent references. Debian's python3-numpy covers the system
# python3; a python3 from elsewhere (pyenv, conda) gets them from PyPI. safetensors is optional: the
# tests that compare with it skip with a message when it is missing.
for module in numpy sentencepiece; do
  if ! python3 -c "import $module" 2>/dev/null; then
    python3 -m pip install --quiet "$module" ||
      echo "install-deps: note: could not install $module for $(command -v python3)" >&2
  fi
done
if ! python3 -c 'import safetensors' 2>/dev/null; then
  python3 -m pip install --quiet safetensors 2>/dev/null ||
    echo "install-deps: note: Python safetensors not installed; tests comparing with it will skip" >&2
fi
[ "$tests" = 1 ] || exit 0

# tensorboard (no torch needed): train.tensorboard_run reads zt's event files with its reader and fails
# without it, unless ZT_SKIP_TENSORBOARD=1.
if ! python3 -c 'import tensorboard' 2>/dev/null; then
  python3 -m pip install --quiet tensorboard ||
    echo "install-deps: note: could not install tensorboard for $(command -v python3); train.tensorboard_run will fail (ZT_SKIP_TENSORBOARD=1 skips it)" >&2
fi

# torch and transformers: tests/export loads zt's exports with AutoTokenizer and AutoModelForCausalLM
# (export.transformers fails without them unless ZT_SKIP_TRANSFORMERS=1), and tests/lora compares
# with peft on them. torch's CPU wheel from its
# own index where that is reachable (a tenth of the size), else PyPI's; transformers converts the
# SentencePiece tokenizer.model with sentencepiece and protobuf.
if ! python3 -c 'import torch' 2>/dev/null; then
  echo "install-deps: installing torch (CPU)"
  python3 -m pip install --quiet --retries 0 --timeout 30 torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
    python3 -m pip install --quiet torch ||
    { echo "install-deps: could not install torch for $(command -v python3)" >&2; exit 1; }
fi
for module in transformers protobuf peft; do
  import=$module
  [ "$module" = protobuf ] && import=google.protobuf
  if ! python3 -c "import $import" 2>/dev/null; then
    echo "install-deps: installing $module"
    python3 -m pip install --quiet "$module" ||
      { echo "install-deps: could not install $module for $(command -v python3)" >&2; exit 1; }
  fi
done

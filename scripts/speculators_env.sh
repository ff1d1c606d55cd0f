#!/usr/bin/env bash
# Create (once) the isolated venv the speculators round-trip test loads `draftwheel export` output with:
# speculators 0.9.0 pins other transformers versions than draftwheel does, so it never shares .venv.
# torch is held at the project's 2.13.0 by a constraint (no second multi-GB torch); the torchvision and
# torchaudio the resolver pulls in for speculators do not load with it and are removed.
# Prints the venv's python on success. Location: $DRAFTWHEEL_SPECULATORS_ENV, default
# ${XDG_CACHE_HOME:-~/.cache}/draftwheel/speculators-0.9.0.
set -euo pipefail
SPECULATORS_VERSION=0.9.0
TORCH_VERSION=2.13.0
ENV_DIR="${DRAFTWHEEL_SPECULATORS_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/draftwheel/speculators-$SPECULATORS_VERSION}"
PYTHON="${PYTHON:-python3}"
stamp="$ENV_DIR/.draftwheel-ready"
check='import transformers, speculators; from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig'

if [ -f "$stamp" ] && "$ENV_DIR/bin/python" -c "$check" 2>/dev/null; then
  echo "$ENV_DIR/bin/python"
  exit 0
fi
rm -f "$stamp"
[ -x "$ENV_DIR/bin/python" ] || "$PYTHON" -m venv "$ENV_DIR"
constraints="$ENV_DIR/constraints.txt"
echo "torch==$TORCH_VERSION" > "$constraints"
"$ENV_DIR/bin/pip" install -q -c "$constraints" "torch==$TORCH_VERSION" "speculators==$SPECULATORS_VERSION" >&2
# The resolver pulls PyPI's torchvision/torchaudio, built for CUDA or another torch: loading their
# operators fails, and transformers imports them on first use of a model class (`import transformers`
# alone still succeeds). Neither is used to load an EAGLE-3 draft; each that does not import is removed.
for package in torchvision torchaudio; do
  if "$ENV_DIR/bin/pip" show -q "$package" 2>/dev/null && ! "$ENV_DIR/bin/python" -c "import $package" 2>/dev/null; then
    echo "speculators_env: removing $package (its build does not load with torch $TORCH_VERSION+cpu)" >&2
    "$ENV_DIR/bin/pip" uninstall -q -y "$package" >&2
  fi
done
if ! "$ENV_DIR/bin/python" -c "$check" >&2; then
  echo "speculators_env: $ENV_DIR cannot import the speculators EAGLE-3 classes" >&2
  exit 1
fi
touch "$stamp"
echo "$ENV_DIR/bin/python"

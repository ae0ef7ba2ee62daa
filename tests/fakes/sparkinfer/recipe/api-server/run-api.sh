#!/usr/bin/env bash
# Stand-in for the recipe's api-server/run-api.sh: the same environment contract, then
# execs server.py (the stand-in bridge) with the same arguments.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -z "${K3_TOKENIZER_DIR:-}" ]]; then
  echo "run-api.sh: K3_TOKENIZER_DIR is not set (the model's native HF tokenizer directory)" >&2
  exit 2
fi
if [[ ! -d "${K3_TOKENIZER_DIR}" ]]; then
  echo "run-api.sh: K3_TOKENIZER_DIR=${K3_TOKENIZER_DIR} does not exist" >&2
  exit 2
fi
if [[ -z "${K3_CHAT_TEMPLATE:-}" ]]; then
  echo "run-api.sh: K3_CHAT_TEMPLATE is not set (path to k3_chat_template.jinja)" >&2
  exit 2
fi
if [[ ! -f "${K3_CHAT_TEMPLATE}" ]]; then
  echo "run-api.sh: K3_CHAT_TEMPLATE=${K3_CHAT_TEMPLATE} does not exist" >&2
  exit 2
fi

PY="${K3_API_PYTHON:-${HERE}/.venv/bin/python}"
exec "${PY}" "${HERE}/server.py" \
  --host "${K3_API_HOST:-127.0.0.1}" \
  --port "${K3_API_PORT:-8000}" \
  --tokenizer-dir "${K3_TOKENIZER_DIR}" \
  --chat-template "${K3_CHAT_TEMPLATE}" \
  --engine-host "${K3_SERVE_HOST:-127.0.0.1}" \
  --engine-port "${K3_SERVE_PORT:-29600}" \
  --model "${K3_MODEL_NAME:-kimi-k3-neuron}" \
  --default-max-tokens "${K3_DEFAULT_MAX_TOKENS:-512}" \
  --max-tokens "${K3_MAX_TOKENS:-512}" \
  --max-context-tokens "${K3_MAX_CONTEXT_TOKENS:-8192}" \
  --engine-timeout-s "${K3_ENGINE_TIMEOUT_S:-600}" \
  "$@"

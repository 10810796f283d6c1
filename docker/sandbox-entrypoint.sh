#!/bin/sh
# Entrypoint of the sandbox image under the `static` backend: derives this server's bearer
# token from the pool secret (HMAC-SHA256(secret, container id), as
# temporal_rollouts/sandbox/backends/tokens.py does on the workers), drops the secret from the
# environment, and execs the server with the token in SANDBOX_TOKEN. Arguments go to the server.
set -eu
: "${SANDBOX_CONTAINER_ID:?SANDBOX_CONTAINER_ID is not set}"
: "${ROLLOUTS_SANDBOX_SECRET:?ROLLOUTS_SANDBOX_SECRET (the pool secret) is not set}"
PYTHON="${PYTHON:-python}"
SANDBOX_TOKEN="$("$PYTHON" -I -c 'import hmac, os
secret = os.environ["ROLLOUTS_SANDBOX_SECRET"]
if len(secret) < 16:
    raise SystemExit("ROLLOUTS_SANDBOX_SECRET must be at least 16 characters long")
print(hmac.new(secret.encode(), os.environ["SANDBOX_CONTAINER_ID"].encode(), "sha256").hexdigest())')"
export SANDBOX_TOKEN
unset ROLLOUTS_SANDBOX_SECRET
exec "$PYTHON" -m temporal_rollouts.sandbox_server --container-id "$SANDBOX_CONTAINER_ID" --token-env SANDBOX_TOKEN "$@"

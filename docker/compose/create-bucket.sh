#!/bin/sh
# Creates the payload bucket in MinIO. Waits for MinIO up to WAIT_S seconds; any failure exits
# non-zero, so `restart: on-failure` runs it again and workers (which need the bucket) wait.
set -eu
: "${S3_ENDPOINT:?S3_ENDPOINT is not set}"
: "${S3_BUCKET:?S3_BUCKET is not set}"
: "${AWS_ACCESS_KEY_ID:?AWS_ACCESS_KEY_ID is not set}"
: "${AWS_SECRET_ACCESS_KEY:?AWS_SECRET_ACCESS_KEY is not set}"
WAIT_S="${WAIT_S:-120}"

waited=0
until mc alias set store "$S3_ENDPOINT" "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >/dev/null 2>&1; do
  if [ "$waited" -ge "$WAIT_S" ]; then
    echo "create-bucket: MinIO at $S3_ENDPOINT not ready after ${WAIT_S}s" >&2
    mc alias set store "$S3_ENDPOINT" "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >&2 || true
    exit 1
  fi
  sleep 2
  waited=$((waited + 2))
done
mc mb --ignore-existing "store/$S3_BUCKET"
echo "create-bucket: store/$S3_BUCKET ready"

#!/bin/sh
# Registers the project's search attributes (temporal_rollouts/core/search_attributes.py) on the
# compose Temporal server. Waits for the server up to WAIT_S seconds, then creates each attribute
# that is missing. Any failure exits non-zero, so `restart: on-failure` runs it again and
# `docker compose ps` shows it; workers start only once it has exited 0.
set -eu
: "${TEMPORAL_ADDRESS:?TEMPORAL_ADDRESS is not set}"
NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
WAIT_S="${WAIT_S:-300}"
ATTRIBUTES="${ROLLOUT_SEARCH_ATTRIBUTES:?ROLLOUT_SEARCH_ATTRIBUTES is not set (NAME=Type ...)}"

waited=0
until temporal operator namespace describe --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE" >/dev/null 2>&1; do
  if [ "$waited" -ge "$WAIT_S" ]; then
    echo "register-search-attributes: Temporal at $TEMPORAL_ADDRESS (namespace $NAMESPACE) not ready after ${WAIT_S}s" >&2
    temporal operator namespace describe --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE" >&2 || true
    exit 1
  fi
  sleep 2
  waited=$((waited + 2))
done

existing="$(temporal operator search-attribute list --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE")"
for spec in $ATTRIBUTES; do
  name="${spec%%=*}"
  type="${spec#*=}"
  if printf '%s\n' "$existing" | grep -qw "$name"; then
    echo "register-search-attributes: $name exists"
    continue
  fi
  if ! temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE" \
      --name "$name" --type "$type"; then
    echo "register-search-attributes: could not create $name ($type)" >&2
    exit 1
  fi
  echo "register-search-attributes: created $name ($type)"
done
echo "register-search-attributes: all registered"

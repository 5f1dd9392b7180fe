#!/usr/bin/env bash
# Debian packages rlvr's tests and local runs use (root; idempotent).
#   bubblewrap: the code_sandbox reward's namespace sandbox (no network, read-only system).
set -euo pipefail
PKGS="bubblewrap"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

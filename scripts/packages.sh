#!/usr/bin/env bash
# `make packages`: .deb and .rpm packages of drover-agent, drover-server and
# droverctl for amd64 and arm64 into dist/, with nfpm used as a Go library
# (packaging/cmd/mkpkg; see packaging/README.md). Extra arguments go to mkpkg:
#   scripts/packages.sh -arch amd64 -format deb -version 1.2.3
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null; then
  echo "packages: Go is missing (see scripts/deps.sh)" >&2
  exit 1
fi
exec go run ./packaging/cmd/mkpkg -out dist "$@"

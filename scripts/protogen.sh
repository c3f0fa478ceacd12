#!/usr/bin/env bash
# Regenerates proto/*.pb.go from proto/agent.proto. Needs protoc (Debian's
# protobuf-compiler); the Go plugins are go tool dependencies in go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
  else
    echo "protoc is missing: install Debian's protobuf-compiler (apt-get install protobuf-compiler)" >&2
    exit 1
  fi
fi
bin=$(mktemp -d); trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
PATH="$bin:$PATH" protoc -I proto -I /usr/include \
  --go_out=proto --go_opt=paths=source_relative \
  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
  proto/agent.proto

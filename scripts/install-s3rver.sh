#!/usr/bin/env bash
# Installs s3rver (an S3-compatible test server, npm) into .npm-deps for tests/remote_test.cc.
# A no-op when the pinned version is there. Needs node and npm (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.7.1
DIR=.npm-deps
if [ -f "$DIR/node_modules/s3rver/package.json" ] &&
   grep -q "\"version\": \"$VERSION\"" "$DIR/node_modules/s3rver/package.json"; then
  exit 0
fi
echo "install-s3rver: installing s3rver@$VERSION into $DIR" >&2
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --no-save --loglevel=error "s3rver@$VERSION" >&2

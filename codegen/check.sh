#!/usr/bin/env bash
# Fails when the committed generated code differs from what proto/ generates.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/codegen/generate.sh" "$tmp"
status=0
if ! diff -u "$root/clients/go/methods.go" "$tmp/clients/go/methods.go"; then status=1; fi
for dir in Sources/CThreadwireProto Sources/ThreadwireWire/Generated Sources/ThreadwireWeb/Generated Tests/Support/ThreadwireWireFixtures contrib/wireshark clients/go/threadwirepb clients/typescript/src/gen; do
  if ! diff -ru "$root/$dir" "$tmp/$dir"; then status=1; fi
done
if [ "$status" != 0 ]; then
  echo "codegen/check.sh: generated code is out of date with proto/; run codegen/generate.sh" >&2
  exit 1
fi
echo "codegen/check.sh: generated code matches proto/"

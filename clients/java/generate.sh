#!/usr/bin/env bash
# Regenerates the committed Java code for the ctxfold API (package dev.ctxfold.v1) from
# ../../proto: protoc (com.google.protobuf:protoc from Maven Central) writes the messages, and
# codegen/GrpcJavaGenerator.java (a protoc plugin in this folder, run by the JDK's source launcher
# against protobuf-java from Maven Central) writes ContextServiceGrpc.java in grpc-java's layout.
#
#   clients/java/generate.sh              # rewrites src/main/java/dev/ctxfold/v1/
#   clients/java/generate.sh --out DIR    # writes DIR/dev/ctxfold/v1/ instead
#   clients/java/generate.sh --check      # regenerates into a temp dir, fails if the committed
#                                         # files differ (the staleness check)
#
# The tools live in clients/java/.tools/ (not committed); the script fills it on first use with
# `mvn dependency:copy`, so a fresh machine needs only Java and Maven. (grpc-java's native
# io.grpc:protoc-gen-grpc-java executables are not served to this machine, hence the local plugin.)
set -euo pipefail

# Keep in step with pom.xml: protobuf.version (runtime) must be >= PROTOC_VERSION.
PROTOC_VERSION=4.36.2
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PROTO_DIR="$ROOT/proto"
TOOLS="${CTXFOLD_JAVA_TOOLS:-$HERE/.tools}"
PACKAGE_DIR="dev/ctxfold/v1"

mode=write
out="$HERE/src/main/java"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --check) mode=check; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "generate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

classifier() {
  local os arch
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=osx ;;
    *) echo "generate.sh: unsupported OS $(uname -s)" >&2; exit 1 ;;
  esac
  case "$(uname -m)" in
    x86_64|amd64) arch=x86_64 ;;
    aarch64|arm64) arch=aarch_64 ;;
    *) echo "generate.sh: unsupported CPU $(uname -m)" >&2; exit 1 ;;
  esac
  echo "$os-$arch"
}

fetch() { # fetch GROUP:ARTIFACT:VERSION[:TYPE[:CLASSIFIER]] DEST_FILE
  local artifact="$1" dest="$2" tmp
  [ -s "$dest" ] && return 0
  tmp="$(mktemp -d)"
  # -N -f: do not read the module's pom; the copy goal needs no project.
  mvn -B -q -N -f "$HERE/pom.xml" "$DEPENDENCY_PLUGIN:copy" \
    -Dartifact="$artifact" -DoutputDirectory="$tmp" -Dmdep.stripVersion=false 2>&1 \
    | sed -e 's/\x1b\[[0-9;]*m//g' -e '/^$/d' >&2
  mv "$tmp"/* "$dest"
  rmdir "$tmp"
}

install_tools() {
  local cls
  cls="$(classifier)"
  mkdir -p "$TOOLS"
  PROTOC="$TOOLS/protoc-$PROTOC_VERSION-$cls.exe"
  INCLUDE="$TOOLS/include-$PROTOC_VERSION"
  PROTOBUF_JAR="$TOOLS/protobuf-java-$PROTOC_VERSION.jar"
  fetch "com.google.protobuf:protoc:$PROTOC_VERSION:exe:$cls" "$PROTOC"
  fetch "com.google.protobuf:protobuf-java:$PROTOC_VERSION" "$PROTOBUF_JAR"
  chmod +x "$PROTOC"
  # protoc runs plugins as executables: a two-line launcher for the source-file plugin.
  GRPC_PLUGIN="$TOOLS/protoc-gen-grpc-java"
  printf '#!/bin/sh\nexec java -cp "%s" "%s"\n' "$PROTOBUF_JAR" "$HERE/codegen/GrpcJavaGenerator.java" >"$GRPC_PLUGIN"
  chmod +x "$GRPC_PLUGIN"
  if [ ! -f "$INCLUDE/google/protobuf/timestamp.proto" ]; then
    # The well-known types (google/protobuf/*.proto) ship inside the protobuf-java jar.
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && jar xf "$PROTOBUF_JAR" google/protobuf)
    rm -rf "$INCLUDE"
    mv "$tmp" "$INCLUDE"
  fi
}

generate_into() { # generate_into OUT_ROOT
  local target="$1"
  rm -rf "${target:?}/$PACKAGE_DIR"
  mkdir -p "$target"
  local protos=()
  while IFS= read -r f; do protos+=("$f"); done < <(cd "$PROTO_DIR" && find ctxfold/v1 -name '*.proto' | LC_ALL=C sort)
  (cd "$PROTO_DIR" && "$PROTOC" \
    -I. -I"$INCLUDE" \
    --plugin=protoc-gen-grpc-java="$GRPC_PLUGIN" \
    --java_out="$target" \
    --grpc-java_out="$target" \
    "${protos[@]}")
}

install_tools

if [ "$mode" = check ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate_into "$tmp"
  if diff -r "$HERE/src/main/java/$PACKAGE_DIR" "$tmp/$PACKAGE_DIR" >/dev/null; then
    echo "generated code is up to date ($(find "$tmp/$PACKAGE_DIR" -name '*.java' | wc -l) files)"
  else
    echo "generated code is STALE: run clients/java/generate.sh" >&2
    diff -r "$HERE/src/main/java/$PACKAGE_DIR" "$tmp/$PACKAGE_DIR" | head -40 >&2 || true
    exit 1
  fi
else
  generate_into "$out"
  echo "wrote $(find "$out/$PACKAGE_DIR" -name '*.java' | wc -l) files to $out/$PACKAGE_DIR"
fi

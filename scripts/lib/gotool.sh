# Sourced by the scripts that build a pinned Go tool into .tools/bin from the Go module proxy.
#
#   go_tool NAME MODULE VERSION PACKAGE
#
# builds PACKAGE (relative to MODULE's root) of MODULE@VERSION as .tools/bin/NAME, unless a
# binary built from VERSION is already there (a NAME.version stamp says which). It builds in
# the module's own directory, so its go.mod and go.sum decide the dependencies, with
# CGO_ENABLED=0. `go install pkg@version` is not used: it asks the proxy for the module's
# version list (for deprecation notices), which the proxy may refuse, while the pinned version
# itself downloads. Messages are prefixed with NAME; a failure exits 1.
go_tool() {
  local name=$1 module=$2 version=$3 pkg=$4
  local root bin out stamp tmp dir
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  bin="$root/.tools/bin"
  out="$bin/$name"
  stamp="$out.version"
  mkdir -p "$bin"
  if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    printf '%s: found %s %s at %s\n' "$name" "$name" "$version" "$out"
    return 0
  fi
  command -v go >/dev/null || { echo "$name: ERROR: go is not on PATH" >&2; exit 1; }
  printf '%s: building %s %s from the Go module proxy (CGO_ENABLED=0)\n' "$name" "$name" "$version"
  tmp=$(mktemp -d)
  dir=$(cd "$tmp" && GOFLAGS= go mod download -json "$module@$version" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ -z "$dir" ] || [ ! -d "$dir" ] || ! (cd "$dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
        go build -trimpath -o "$tmp/$name" "$pkg"); then
    rm -rf "$tmp"
    echo "$name: ERROR: building $name $version failed: check access to the Go module proxy" >&2
    exit 1
  fi
  mv "$tmp/$name" "$out"
  rm -rf "$tmp"
  echo "$version" > "$stamp"
  printf '%s: installed %s %s at %s\n' "$name" "$name" "$version" "$out"
}

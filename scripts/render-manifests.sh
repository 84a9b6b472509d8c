#!/usr/bin/env bash
# Renders packaging/kubernetes/ for another image reference and another kubelet root, into a
# directory to `kubectl apply -f`.
#
#   scripts/render-manifests.sh [--image=REF] [--kubelet-root=DIR] [--out=DIR]
#
#   --image         the image every csi-nodekit container runs, e.g. one pushed to your registry
#                   (default: localhost/csi-nodekit:<version>, as shipped)
#   --kubelet-root  the kubelet's --root-dir on the nodes (default /var/lib/kubelet); MicroK8s:
#                   /var/snap/microk8s/common/var/lib/kubelet, k0s: /var/lib/k0s/kubelet
#   --out           where the rendered files go, with the same names (default target/manifests);
#                   files there of other names are left alone
#
# The kubelet root is in every hostPath, in node-server's mount paths (it mounts at the paths
# the kubelet names, so they must match on both sides), in the registrar's
# --kubelet-registration-path and in the comments; the doctor pod is told it with
# --kubelet-root. tests/packaging/manifests.rs validates what this writes.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '5,12s/^# \{0,1\}//p' "$0" >&2
}
fail_usage() {
  echo "render-manifests.sh: $1" >&2
  exit 2
}

image=
root=
out=target/manifests
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case $arg in
    --image=* | --kubelet-root=* | --out=*) name=${arg%%=*} value=${arg#*=} ;;
    --image | --kubelet-root | --out)
      [ $# -gt 0 ] || fail_usage "flag needs an argument: $arg"
      name=$arg value=$1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) fail_usage "flag provided but not defined: $arg" ;;
  esac
  case $name in
    --image) image=$value ;;
    --kubelet-root) root=$value ;;
    --out) out=$value ;;
  esac
done

# Only characters that need no quoting in YAML and no escaping in sed.
if [ -n "$image" ] && ! [[ $image =~ ^[A-Za-z0-9][A-Za-z0-9._/:@-]*$ ]]; then
  fail_usage "invalid value \"$image\" for flag --image: not an image reference"
fi
if [ -n "$root" ]; then
  root=${root%/}
  [[ $root =~ ^/[A-Za-z0-9._/-]+$ ]] && ! [[ $root =~ (^|/)\.\.?(/|$) ]] ||
    fail_usage "invalid value \"$root\" for flag --kubelet-root: not an absolute plain path"
fi
[ -n "$out" ] || fail_usage "invalid value \"\" for flag --out: empty"

src=packaging/kubernetes
expressions=()
if [ -n "$image" ]; then
  # Our containers' image lines; the drop-in's "# was: registry.k8s.io/…" comments stay.
  expressions+=(-e "s|^\( *image: \)localhost/csi-nodekit:[^ ]*$|\1$image|")
fi
if [ -n "$root" ]; then
  expressions+=(-e "s|/var/lib/kubelet|$root|g")
  # The doctor finds the root from the running kubelet's flags; told, it need not guess.
  expressions+=(-e "s|^\( *\)- --host-root=/host$|&\n\1- --kubelet-root=$root|")
fi

count=0
while IFS= read -r -d '' file; do
  rel=${file#"$src"/}
  mkdir -p "$out/$(dirname "$rel")"
  if [ ${#expressions[@]} -gt 0 ]; then
    sed "${expressions[@]}" "$file" >"$out/$rel"
  else
    cp "$file" "$out/$rel"
  fi
  count=$((count + 1))
done < <(find "$src" -name '*.yaml' -type f -print0 | sort -z)
echo "$count manifests in $out (image: ${image:-as shipped}, kubelet root: ${root:-/var/lib/kubelet})"

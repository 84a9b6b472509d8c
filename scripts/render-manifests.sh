#!/usr/bin/env bash
# Renders the kustomize base in packaging/kubernetes/ (with `kubectl kustomize`) for another
# image, another kubelet root and the optional components, into a directory to apply.
#
#   scripts/render-manifests.sh [--image=REF] [--kubelet-root=DIR] [--with=LIST]
#                               [--snapshot-metadata-ca=FILE] [--out=DIR]
#
#   --image         the image every csi-nodekit container runs, e.g. one pushed to your registry
#                   (default: localhost/csi-nodekit:<version>, as shipped)
#   --kubelet-root  the kubelet's --root-dir on the nodes (default /var/lib/kubelet); MicroK8s:
#                   /var/snap/microk8s/common/var/lib/kubelet, k0s: /var/lib/k0s/kubelet
#   --with          components to add, comma-separated: snapshots, metrics, selinux (volumes
#                   mounted with their pod's SELinux label: image volumes only),
#                   snapshot-metadata (changed-block backups; with snapshots) (default: none)
#   --snapshot-metadata-ca
#                   with snapshot-metadata, required: the CA certificate (PEM) that signed the
#                   sidecar's TLS certificate, put in the SnapshotMetadataService for clients
#   --out           where the rendered files go (default target/manifests): csi-nodekit.yaml
#                   (kubectl apply -f it) and examples/, drop-in/, tools/; other files are left
#
# A tag that names one build (<version>-<12 hex digits>, as scripts/build-image.sh makes) or a
# digest (@sha256:…) gets `imagePullPolicy: IfNotPresent`; any other tag `Always`, since a
# rebuild under the same tag would otherwise never reach a node that has the old image.
# The kubelet root is in every hostPath, in node-server's mount paths (it mounts at the paths
# the kubelet names), in the registrar's registration path; the doctor pod is told it with
# --kubelet-root. A relative --snapshot-metadata-ca is read from the directory the script is
# run from; a relative --out is under the repository. tests/packaging/ validates what this
# writes.
set -euo pipefail
called_from=$PWD
cd "$(dirname "$0")/.."

usage() {
  sed -n '5,19s/^# \{0,1\}//p' "$0" >&2
}
fail_usage() {
  echo "render-manifests.sh: $1" >&2
  exit 2
}

image=
root=
with=
ca=
out=target/manifests
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case $arg in
    --image=* | --kubelet-root=* | --out=* | --with=* | --snapshot-metadata-ca=*)
      name=${arg%%=*} value=${arg#*=}
      ;;
    --image | --kubelet-root | --out | --with | --snapshot-metadata-ca)
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
    --with) with=$value ;;
    --snapshot-metadata-ca) ca=$value ;;
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
components=()
if [ -n "$with" ]; then
  IFS=, read -r -a wanted <<<"$with"
  for component in "${wanted[@]}"; do
    case $component in
      snapshots | metrics | selinux | snapshot-metadata) components+=("$component") ;;
      *) fail_usage "invalid value \"$with\" for flag --with: components are snapshots, metrics, selinux, snapshot-metadata" ;;
    esac
  done
fi
# The SnapshotMetadataService tells clients which CA to trust; the component ships a placeholder.
ca_base64=
if [[ ",$with," == *,snapshot-metadata,* ]]; then
  [ -n "$ca" ] ||
    fail_usage "flag --with=snapshot-metadata needs --snapshot-metadata-ca=FILE: the CA certificate (PEM) that signed the sidecar's TLS certificate"
  ca_file=$ca
  [[ $ca_file == /* ]] || ca_file=$called_from/$ca_file
  [ -f "$ca_file" ] && [ -r "$ca_file" ] && grep -q -- '-----BEGIN CERTIFICATE-----' "$ca_file" ||
    fail_usage "invalid value \"$ca\" for flag --snapshot-metadata-ca: not a readable PEM certificate file"
  ca_base64=$(base64 -w0 "$ca_file")
elif [ -n "$ca" ]; then
  fail_usage "flag --snapshot-metadata-ca is only for --with=…,snapshot-metadata"
fi
[ -n "$out" ] || fail_usage "invalid value \"\" for flag --out: empty"

# The image reference in kustomize's terms: a name and a tag or a digest.
new_name= new_tag= new_digest= policy=
if [ -n "$image" ]; then
  if [[ $image == *@* ]]; then
    new_name=${image%%@*} new_digest=${image#*@}
    [[ $new_digest =~ ^sha256:[0-9a-f]{64}$ ]] ||
      fail_usage "invalid value \"$image\" for flag --image: a digest is sha256: and 64 hex digits"
    # name:tag@digest: the digest decides, the tag is dropped.
    [[ ${new_name##*/} == *:* ]] && new_name=${new_name%:*}
    policy=IfNotPresent
    image=$new_name@$new_digest
  else
    [[ ${image##*/} == *:* ]] ||
      fail_usage "invalid value \"$image\" for flag --image: no tag (name:tag or name@sha256:…)"
    new_name=${image%:*} new_tag=${image##*:}
    if [[ $new_tag =~ ^[0-9][0-9A-Za-z.-]*-[0-9a-f]{12}$ ]]; then
      policy=IfNotPresent
    else
      policy=Always
    fi
  fi
fi

command -v kubectl >/dev/null 2>&1 || {
  echo "render-manifests.sh: kubectl is needed (its built-in kustomize renders the manifests);" \
    "install it from https://kubernetes.io/docs/tasks/tools/" >&2
  exit 1
}

# The kubelet-root patch; overlays/microk8s and overlays/k0s hold its output for their roots.
kubelet_root_patch() {
  local r=$1
  cat <<EOF
# The node plugin under the kubelet root $r (generated by
# scripts/render-manifests.sh --kubelet-root=$r). node-server mounts the kubelet's
# directories at their host paths, because the kubelet hands it host paths.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: csi-nodekit
  namespace: csi-nodekit
spec:
  template:
    spec:
      containers:
        - name: node-server
          volumeMounts:
            - mountPath: /var/lib/kubelet/pods
              \$patch: delete
            - mountPath: /var/lib/kubelet/plugins
              \$patch: delete
            - mountPath: /var/lib/kubelet/plugins_registry
              \$patch: delete
            - name: pods-dir
              mountPath: $r/pods
              mountPropagation: Bidirectional
            - name: plugins-dir
              mountPath: $r/plugins
              mountPropagation: Bidirectional
            - name: registration-dir
              mountPath: $r/plugins_registry
              readOnly: true
        - name: registrar
          env:
            - name: DRIVER_REG_SOCK_PATH
              value: $r/plugins/nodekit.csi.local/csi.sock
      volumes:
        - name: socket-dir
          hostPath:
            path: $r/plugins/nodekit.csi.local
        - name: registration-dir
          hostPath:
            path: $r/plugins_registry
        - name: plugins-dir
          hostPath:
            path: $r/plugins
        - name: pods-dir
          hostPath:
            path: $r/pods
EOF
}
if [ "${RENDER_PATCH_ONLY:-}" = 1 ]; then
  # For maintainers: the overlays' patch for a root, e.g. after changing the function above.
  kubelet_root_patch "${root:-/var/lib/kubelet}"
  exit 0
fi

src=packaging/kubernetes
# kustomize takes bases only by relative path: the overlay goes two levels below the root.
mkdir -p target
work=$(mktemp -d "$PWD/target/render-manifests.XXXXXX")
trap 'rm -rf "$work"' EXIT
up=../..
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  echo "  - $up/$src/base"
  if [ ${#components[@]} -gt 0 ]; then
    echo "components:"
    for component in "${components[@]}"; do
      echo "  - $up/$src/components/$component"
    done
  fi
  if [ -n "$image" ]; then
    echo "images:"
    echo "  - name: localhost/csi-nodekit"
    echo "    newName: $new_name"
    [ -z "$new_tag" ] || echo "    newTag: \"$new_tag\""
    [ -z "$new_digest" ] || echo "    digest: $new_digest"
  fi
  if [ -n "$image$root$ca_base64" ]; then
    echo "patches:"
    [ -z "$image" ] || echo "  - path: policy.yaml"
    [ -z "$root" ] || echo "  - path: kubelet-root.yaml"
    [ -z "$ca_base64" ] || echo "  - path: snapshot-metadata-ca.yaml"
  fi
} >"$work/kustomization.yaml"
# Our four containers' pull policy for the image given (as shipped: Always, for the version's
# movable tag).
[ -z "$image" ] || {
  echo "apiVersion: apps/v1"
  echo "kind: DaemonSet"
  echo "metadata: {name: csi-nodekit, namespace: csi-nodekit}"
  echo "spec:"
  echo "  template:"
  echo "    spec:"
  echo "      containers:"
  for container in node-server registrar liveness-probe; do
    echo "        - {name: $container, imagePullPolicy: $policy}"
  done
  echo "---"
  echo "apiVersion: apps/v1"
  echo "kind: Deployment"
  echo "metadata: {name: csi-nodekit-resizer, namespace: csi-nodekit}"
  echo "spec:"
  echo "  template:"
  echo "    spec:"
  echo "      containers:"
  echo "        - {name: resizer-endpoint, imagePullPolicy: $policy}"
} >"$work/policy.yaml"
[ -z "$root" ] || kubelet_root_patch "$root" >"$work/kubelet-root.yaml"
[ -z "$ca_base64" ] || {
  echo "apiVersion: cbt.storage.k8s.io/v1beta1"
  echo "kind: SnapshotMetadataService"
  echo "metadata: {name: nodekit.csi.local}"
  echo "spec: {caCert: $ca_base64}"
} >"$work/snapshot-metadata-ca.yaml"

mkdir -p "$out"
kubectl kustomize "$work" >"$out/csi-nodekit.yaml"

# The files outside the base: the same changes by sed, on the lines that carry them.
expressions=()
if [ -n "$image" ]; then
  # Our containers' image lines; the drop-in's "# was: registry.k8s.io/…" comments stay. The
  # pull policy sits on the line after the image.
  expressions+=(-e "/^ *image: localhost\/csi-nodekit:[^ ]*$/{s|\(image: \).*|\1$image|;n;s|\(imagePullPolicy: \).*|\1$policy|}")
fi
if [ -n "$root" ]; then
  expressions+=(-e "s|/var/lib/kubelet|$root|g")
  # The doctor finds the root from the running kubelet's flags; told, it need not guess.
  expressions+=(-e "s|^\( *\)- --host-root=/host$|&\n\1- --kubelet-root=$root|")
fi
count=1
for dir in examples drop-in tools; do
  while IFS= read -r -d '' file; do
    rel=${file#"$src"/}
    mkdir -p "$out/$(dirname "$rel")"
    if [ ${#expressions[@]} -gt 0 ]; then
      sed "${expressions[@]}" "$file" >"$out/$rel"
    else
      cp "$file" "$out/$rel"
    fi
    count=$((count + 1))
  done < <(find "$src/$dir" -name '*.yaml' -type f -print0 | sort -z)
done
echo "$count files in $out: csi-nodekit.yaml (image: ${image:-as shipped}," \
  "kubelet root: ${root:-/var/lib/kubelet}, components: ${with:-none}) and examples/, drop-in/, tools/"

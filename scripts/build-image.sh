#!/usr/bin/env bash
# Builds the FROM scratch image (packaging/Containerfile) reproducibly and saves it as an OCI
# archive, then prints its digest and size.
#
#   scripts/build-image.sh
#
# Environment:
#   SOURCE_DATE_EPOCH  timestamp for the image and every file in it (default 0, the epoch)
#   IMAGE_OUT          where the archive goes (default target/image)
#   IMAGE_NAME         local image name (default localhost/csi-nodekit), tagged with the version
#   CARGO_TARGET_DIR   as for cargo; the static binary is built there
#   IMAGE_TOOL         buildah or podman (default: whichever is installed, buildah first)
#   IMAGE_BINARY       use this static binary instead of building one
#
# The same binary always gives the same image digest and the same archive bytes: fixed
# timestamps, no build history, no builder-version label, files sorted in the archive.
# Uses buildah, else podman; installs buildah with apt-get when neither is there.
set -euo pipefail
cd "$(dirname "$0")/.."

epoch=${SOURCE_DATE_EPOCH:-0}
out=${IMAGE_OUT:-target/image}
name=${IMAGE_NAME:-localhost/csi-nodekit}
links=(csi-node-server csi-node-driver-registrar node-driver-registrar livenessprobe)

# 1. The static binary (a no-op when it is up to date).
if [ -n "${IMAGE_BINARY:-}" ]; then
  bin=$IMAGE_BINARY
else
  nice scripts/build-static.sh >&2
  bin="${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/csi-nodekit"
fi
version=$("$bin" --version)
version=${version#csi-nodekit }

# 2. The image builder.
if [ -n "${IMAGE_TOOL:-}" ]; then
  tool=$IMAGE_TOOL
elif command -v buildah >/dev/null 2>&1; then
  tool=buildah
elif command -v podman >/dev/null 2>&1; then
  tool=podman
else
  echo "installing buildah" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
  tool=buildah
fi

# 3. The build context: the binary and the mode links, nothing else.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/context" "$work/context/links"
cp "$bin" "$work/context/csi-nodekit"
for link in "${links[@]}"; do
  ln -s csi-nodekit "$work/context/links/$link"
done

# 4. Build. Removing the old tag first keeps rebuilds from piling up untagged images.
"$tool" rmi --force "$name:$version" >/dev/null 2>&1 || true
"$tool" build --quiet \
  --format oci \
  --timestamp "$epoch" \
  --omit-history \
  --layers=false \
  --identity-label=false \
  --build-arg "VERSION=$version" \
  --file packaging/Containerfile \
  --tag "$name:$version" \
  "$work/context" >/dev/null

# 5. Save: an OCI image layout, tarred with fixed order, owners and times.
"$tool" push --quiet --digestfile "$work/digest" "$name:$version" "oci:$work/layout:$name:$version"
mkdir -p "$out"
archive="$out/csi-nodekit-$version.oci.tar"
tar --create --file "$archive" --directory "$work/layout" --format=gnu --sort=name \
  --mtime="@$epoch" --owner=0 --group=0 --numeric-owner .

digest=$(cat "$work/digest")
size=$(stat -c %s "$archive")
sum=$(sha256sum "$archive")
echo "image:   $name:$version (built with $tool)"
echo "digest:  $digest"
echo "archive: $archive, $size bytes ($((size / 1024)) KiB), sha256:${sum%% *}"

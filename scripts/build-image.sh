#!/usr/bin/env bash
# Builds the FROM scratch image (packaging/Containerfile) reproducibly and saves it as an OCI
# archive, with its SBOM (CycloneDX JSON) beside it, then prints its digest and size. The image
# holds the licence notices of everything linked into the binary in /licenses/
# (examples/notices.rs); the SBOM names the image by its digest (examples/sbom.rs).
#
#   scripts/build-image.sh
#
# Environment:
#   SOURCE_DATE_EPOCH  timestamp for the image and every file in it (default: the date of the
#                      commit checked out, so `created` says when the source was made; 0, the
#                      epoch, outside a git checkout)
#   IMAGE_OUT          where the archive goes (default target/image)
#   IMAGE_NAME         local image name (default localhost/csi-nodekit), tagged with the version
#   CARGO_TARGET_DIR   as for cargo; the static binary is built there
#   IMAGE_TOOL         buildah or podman (default: whichever is installed, buildah first)
#   IMAGE_BINARY       use this static binary instead of building one
#   IMAGE_SBOM         0: write no SBOM and no licence notices (for a stand-in binary built
#                      without cargo auditable, which has no dependency list to make them from;
#                      such an image is for tests only; default 1)
#
# Each build is also tagged <version>-<first 12 hex digits of its digest> (a tag that names this
# build's content, unlike the version's tag, which every rebuild moves); the archive carries both
# names, and the Kubernetes manifests are rendered for the build's tag, with
# `imagePullPolicy: IfNotPresent`, into <IMAGE_OUT>/manifests/ (needs kubectl; without it the
# script says how to render them later).
#
# The same binary always gives the same image digest and the same archive bytes: fixed
# timestamps, no build history, no builder-version label, files sorted in the archive.
# Uses buildah, else podman; when neither is installed it says so and how to get one (it never
# installs anything itself). It never forces anything: a rebuild moves the tag to the new image
# and removes the old one only if nothing (no container, no other tag) still uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
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
  echo "build-image.sh: neither buildah nor podman is installed; install one of them" \
    "(Debian/Ubuntu: apt-get install buildah; Fedora/RHEL: dnf install buildah) and run again" >&2
  exit 1
fi
command -v "$tool" >/dev/null 2>&1 || {
  echo "build-image.sh: IMAGE_TOOL=$tool is not installed" >&2
  exit 1
}

# 3. The build context: the binary, the mode links and the licence notices.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/context" "$work/context/links" "$work/context/licenses"
cp "$bin" "$work/context/csi-nodekit"
for link in "${links[@]}"; do
  ln -s csi-nodekit "$work/context/links/$link"
done
# The notices, from the dependency list the binary carries (cargo auditable's .dep-v0), the
# crates' sources and this machine's C libraries: the same binary, commit and machine give the
# same bytes. A binary without the list stops the build here, before anything is built. It
# prints the SPDX expression of everything linked in, for the image's licences label.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit, with changes not committed"
fi
licenses=
if [ "${IMAGE_SBOM:-1}" != 0 ]; then
  licenses=$(cargo run --quiet --locked --example notices -- "$bin" "$work/context/licenses" "$commit")
fi

# 4. Build. The tag moves to the new image; the image it held before is removed only when
#    nothing uses it any more (no --force: a user's container keeps its image).
build_args=(--build-arg "VERSION=$version")
if [ -n "$licenses" ]; then
  build_args+=(--build-arg "LICENSES=$licenses")
fi
old_id=$("$tool" images --quiet --no-trunc "$name:$version" 2>/dev/null || true)
"$tool" build --quiet \
  --format oci \
  --timestamp "$epoch" \
  --omit-history \
  --layers=false \
  --identity-label=false \
  "${build_args[@]}" \
  --file packaging/Containerfile \
  --tag "$name:$version" \
  "$work/context" >/dev/null
new_id=$("$tool" images --quiet --no-trunc "$name:$version")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  "$tool" rmi "$old_id" >/dev/null 2>&1 ||
    echo "kept the previous image ${old_id:0:12}: still in use" >&2
fi

# 5. Save: an OCI image layout, tarred with fixed order, owners and times. The build's own tag
#    goes into the archive beside the version's; the local store keeps only the version's tag,
#    so a rebuild replaces the image as before.
"$tool" push --quiet --digestfile "$work/digest" "$name:$version" "oci:$work/layout:$name:$version"
digest=$(cat "$work/digest")
hex=${digest#sha256:}
build_tag="$version-${hex:0:12}"
"$tool" tag "$name:$version" "$name:$build_tag"
"$tool" push --quiet "$name:$build_tag" "oci:$work/layout:$name:$build_tag"
"$tool" rmi "$name:$build_tag" >/dev/null
mkdir -p "$out"
archive="$out/csi-nodekit-$version.oci.tar"
tar --create --file "$archive" --directory "$work/layout" --format=gnu --sort=name \
  --mtime="@$epoch" --owner=0 --group=0 --numeric-owner .

# 6. The SBOM, now that the image's digest is known: its subject is the image, its timestamp
#    the archive's. The same binary gives the same bytes.
sbom=
if [ "${IMAGE_SBOM:-1}" != 0 ]; then
  created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
  sbom="$out/csi-nodekit-$version.cdx.json"
  cargo run --quiet --locked --example sbom -- "$bin" "$created" "$name" "$digest" >"$sbom.tmp"
  mv "$sbom.tmp" "$sbom"
fi

size=$(stat -c %s "$archive")
sum=$(sha256sum "$archive")
# 7. The manifests for this build's tag.
render=(scripts/render-manifests.sh "--image=$name:$build_tag" "--out=$out/manifests")
manifests=
if command -v kubectl >/dev/null 2>&1; then
  "${render[@]}" >&2
  manifests="$out/manifests/csi-nodekit.yaml"
else
  echo "build-image.sh: kubectl is not installed, so no manifests were rendered; with it:" \
    "${render[*]} --with=…" >&2
fi

echo "image:   $name:$version (built with $tool)"
echo "tag:     $name:$build_tag (this build)"
echo "digest:  $digest"
echo "archive: $archive, $size bytes ($((size / 1024)) KiB), sha256:${sum%% *}"
if [ -n "$sbom" ]; then
  echo "sbom:    $sbom (CycloneDX)"
  notices=$(find "$work/context/licenses" -type f -printf '%s\n' | awk '{n++; s+=$1} END {print n+0 " files, " s+0}')
  echo "notices: /licenses/ in the image, $notices bytes"
fi
if [ -n "$manifests" ]; then
  echo "manifests: $manifests (image $name:$build_tag, imagePullPolicy IfNotPresent)"
fi

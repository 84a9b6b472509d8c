#!/usr/bin/env bash
# Installs what the quota VM test (tests/booted/quota_vm/) needs on a Debian 12 machine: QEMU and
# the tools virtme-ng uses in the guest, the filesystem tools the tests run, virtme-ng from
# PyPI, and Debian's kernel unpacked under target/vm/kernel. Idempotent and quiet: a second
# run installs nothing and prints nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned: Debian 12's kernel from bookworm-security (XFS and ext4 as modules, quota_v2,
# quotactl_fd) and the virtme-ng release the harness was written against.
kernel_abi=6.1.0-57-amd64
kernel_version=6.1.192-3
vng_version=1.42

vm_dir="${CARGO_TARGET_DIR:-$PWD/target}/vm"
quiet_apt=(-qq -o=Dpkg::Use-Pty=0)

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have qemu-system-x86_64 || need+=(qemu-system-x86)
have busybox || need+=(busybox-static)
have modprobe || need+=(kmod)
have udevadm || need+=(udev)
have mkfs.xfs || need+=(xfsprogs)
have mkfs.ext4 || need+=(e2fsprogs)
have file || need+=(file)        # virtme-ng reads the kernel's version with file(1)
have python3 || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
updated=
if [ ${#need[@]} -gt 0 ]; then
  apt-get update "${quiet_apt[@]}"
  updated=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${quiet_apt[@]}" "${need[@]}" >/dev/null
fi

if [ "$(vng --version 2>/dev/null)" != "virtme-ng $vng_version" ]; then
  pip=(python3 -m pip install --quiet --disable-pip-version-check "virtme-ng==$vng_version")
  PIP_ROOT_USER_ACTION=ignore "${pip[@]}" 2>/dev/null ||
    PIP_ROOT_USER_ACTION=ignore "${pip[@]}" --break-system-packages
fi

dir="$vm_dir/linux-image-$kernel_abi-$kernel_version"
if [ ! -e "$dir/.complete" ]; then
  mkdir -p "$vm_dir"
  tmp=$(mktemp -d "$vm_dir/.download.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  download() { (cd "$tmp" && apt-get download "${quiet_apt[@]}" -o APT::Sandbox::User=root "$1" >/dev/null 2>&1); }
  if ! download "linux-image-$kernel_abi=$kernel_version"; then
    [ -n "$updated" ] || apt-get update "${quiet_apt[@]}"
    if ! download "linux-image-$kernel_abi=$kernel_version"; then
      # Debian drops superseded kernels from its archive; rather than no VM test at all,
      # take the kernel the current linux-image-amd64 depends on, and say so loudly.
      dep=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)
      echo "WARNING: linux-image-$kernel_abi=$kernel_version is no longer served;" \
        "using $dep instead (update the pin in scripts/vm-kernel.sh)" >&2
      kernel_abi=${dep#linux-image-}
      kernel_version=$(apt-cache policy "$dep" | sed -n 's/^ *Candidate: //p')
      dir="$vm_dir/linux-image-$kernel_abi-$kernel_version"
      download "$dep=$kernel_version"
    fi
  fi
  dpkg-deb -x "$tmp"/linux-image-*.deb "$tmp/root"
  # Drivers a QEMU guest never loads: half the unpacked size.
  modules="$tmp/root/lib/modules/$kernel_abi/kernel"
  rm -rf "$modules"/drivers/{gpu,media,infiniband,net/wireless,staging} "$modules/sound" "$tmp/root/usr"
  depmod -b "$tmp/root" "$kernel_abi"
  rm -rf "$dir"
  mv "$tmp/root" "$dir"
  touch "$dir/.complete"
fi
ln -sfn "$(basename "$dir")" "$vm_dir/kernel"

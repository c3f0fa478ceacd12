#!/usr/bin/env bash
# Makes sure the tools `make test` needs are on this machine. As root on
# Debian/Ubuntu it installs the missing packages with apt-get; otherwise it
# stops and names exactly what is missing.
set -euo pipefail

need_go="1.26"
if ! command -v go >/dev/null; then
  echo "deps: Go is missing: install Go ${need_go} or newer (https://go.dev/doc/install)" >&2
  exit 1
fi
have_go=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  echo "deps: Go $have_go is too old: Drover needs Go ${need_go} or newer" >&2
  exit 1
fi

# command -> Debian package that provides it
declare -A pkg_of=(
  [systemd-analyze]=systemd
  [systemctl]=systemd
  [unshare]=util-linux
  [dbus-daemon]=dbus
  [debootstrap]=debootstrap
  [systemd-nspawn]=systemd-container
  [rpm]=rpm
  [rpm2cpio]=rpm2cpio
  [cpio]=cpio
  [lintian]=lintian
  [rpmlint]=rpmlint
  [dpkg-deb]=dpkg
  [chromium]=chromium
  [prometheus-alertmanager]=prometheus-alertmanager
  [promtool]=prometheus
  [pg_ctlcluster]=postgresql
)
missing=()
for cmd in "${!pkg_of[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_of[$cmd]}")
done
[ -x /lib/systemd/systemd ] || missing+=(systemd)
[ -e /usr/share/zoneinfo/Antarctica/Troll ] || missing+=(tzdata)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi
echo "deps: missing Debian packages: ${missing[*]}" >&2
echo "deps: install them with: sudo apt-get install ${missing[*]}" >&2
exit 1

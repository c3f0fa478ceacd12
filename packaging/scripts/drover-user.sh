# --- drover-user.sh (shared by the drover-server maintainer scripts,
# inlined at build time) ---
# drover_create_user creates the system user and group `drover` (home
# /var/lib/drover-server, no login) unless they exist: with systemd-sysusers
# and the package's sysusers.d entry where systemd is installed, else useradd
# (the packages depend on one of the two). An existing user is left as it is.
drover_create_user() {
	if getent passwd drover >/dev/null 2>&1; then
		return 0
	fi
	if command -v systemd-sysusers >/dev/null 2>&1; then
		# The entry is given on stdin: in preinst the file is not unpacked yet.
		printf '%s\n' 'u drover - "Drover control plane" /var/lib/drover-server /usr/sbin/nologin' |
			systemd-sysusers --replace=/usr/lib/sysusers.d/drover-server.conf -
	elif command -v useradd >/dev/null 2>&1; then
		getent group drover >/dev/null 2>&1 || groupadd --system drover
		useradd --system --gid drover --home-dir /var/lib/drover-server --no-create-home \
			--shell /usr/sbin/nologin --comment "Drover control plane" drover
	else
		echo "drover-server: cannot create the system user drover: neither systemd-sysusers nor useradd" >&2
		return 1
	fi
	getent passwd drover >/dev/null 2>&1
}
# --- end of drover-user.sh ---

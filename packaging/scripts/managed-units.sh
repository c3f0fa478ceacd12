# --- managed-units.sh (shared by the drover-agent maintainer scripts,
# inlined at build time) ---
# The one rule: a unit is Drover's only when its file directly in
# /etc/systemd/system is a regular file whose first line is exactly the
# managed header. Nothing else is ever stopped, disabled or removed.

drover_header='# Managed by drover-agent. Local changes are overwritten.'
drover_unit_dir=/etc/systemd/system

# drover_managed_units prints the names of the units the agent manages, one
# a line.
drover_managed_units() {
	for f in "$drover_unit_dir"/*; do
		[ -f "$f" ] && [ ! -L "$f" ] || continue
		[ "$(head -n 1 "$f" 2>/dev/null)" = "$drover_header" ] || continue
		printf '%s\n' "${f##*/}"
	done
}

# drover_remove_managed_units stops the managed timers, removes the managed
# unit files, their enablement links and the agent's runtime drop-ins, then
# reloads systemd. Pipe services that are running are left to finish.
drover_remove_managed_units() {
	drover_units=$(drover_managed_units)
	[ -n "$drover_units" ] || return 0
	drover_running=
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
		drover_running=1
	fi
	printf '%s\n' "$drover_units" | while IFS= read -r u; do
		case "$u" in
		*.timer)
			[ -z "$drover_running" ] || systemctl stop "$u" >/dev/null 2>&1 || true
			;;
		esac
	done
	printf '%s\n' "$drover_units" | while IFS= read -r u; do
		rm -f "$drover_unit_dir/$u"
		# Links named after the unit in *.wants/ and *.requires/ enable it.
		for l in "$drover_unit_dir"/*.wants/"$u" "$drover_unit_dir"/*.requires/"$u"; do
			if [ -L "$l" ]; then rm -f "$l"; fi
		done
		rm -f "/run/systemd/system/$u.d/50-drover-guard.conf"
		rmdir "/run/systemd/system/$u.d" 2>/dev/null || true
	done
	if [ -n "$drover_running" ]; then
		systemctl daemon-reload >/dev/null 2>&1 || true
		printf '%s\n' "$drover_units" | while IFS= read -r u; do
			systemctl reset-failed "$u" >/dev/null 2>&1 || true
		done
	fi
}

# drover_remove_stamps removes the Persistent= stamps of pipe timers whose
# unit no longer exists anywhere.
drover_remove_stamps() {
	for s in /var/lib/systemd/timers/stamp-drover-pipe-*.timer; do
		[ -f "$s" ] || continue
		u=${s##*/stamp-}
		for d in /etc/systemd/system /run/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system /lib/systemd/system; do
			[ -e "$d/$u" ] && continue 2
		done
		rm -f "$s"
	done
}
# --- end of managed-units.sh ---

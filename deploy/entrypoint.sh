#!/bin/sh
# Entry point of both images (Dockerfile): run the command as the app user `mtfl` (uid 1000).
#
# Started as root (the images' default user), it first hands the app user the folders it writes
# that it does not own yet: a host folder bind-mounted there (ARTIFACT_SOURCE=/srv/mtfl, say) is
# usually root's, and the app could not write to it. Only entries not yet owned by the app user
# are changed (links themselves, within that file system), so a restart costs a scan, not a
# rewrite. A folder it cannot chown (NFS with root_squash) is fine if the app user can write to it. Started as another user (`docker run
# --user`), it changes nothing and runs the command as that user.
#
# MTFL_WRITABLE_DIRS: the folders to hand over, space-separated (default: the artifact store and
# the agent's state folder). Read-only mounts (the data sets) are left alone.
set -eu
app_user=mtfl
if [ "$(id -u)" = 0 ]; then
  uid=$(id -u "$app_user")
  gid=$(id -g "$app_user")
  for dir in ${MTFL_WRITABLE_DIRS:-/var/lib/mtfl/artifacts /var/lib/mtfl/agent}; do
    [ -d "$dir" ] || continue
    # -xdev: not into other file systems mounted below; chown -h: a link itself, never what it
    # points to (a link in a host folder must not hand the image's own files to the app user).
    if [ -n "$(find "$dir" -xdev ! -user "$uid" -print -quit)" ]; then
      echo "mtfl-entrypoint: giving $dir to $app_user (uid $uid)" >&2
      if ! find "$dir" -xdev ! -user "$uid" -exec chown -h "$uid:$gid" {} +; then
        # NFS with root_squash, say: fine as long as the app user can write there anyway.
        setpriv --reuid="$uid" --regid="$gid" --init-groups -- test -w "$dir" \
          || { echo "mtfl-entrypoint: $dir is not writable by uid $uid and cannot be chowned" >&2; exit 1; }
        echo "mtfl-entrypoint: could not chown all of $dir; uid $uid can write to it, going on" >&2
      fi
    fi
  done
  # setpriv keeps the environment: HOME must be the app user's, or caches land in /root.
  HOME=$(getent passwd "$app_user" | cut -d: -f6)
  export HOME
  exec setpriv --reuid="$uid" --regid="$gid" --init-groups -- "$@"
fi
exec "$@"

#!/bin/sh
# Entry point of both images (Dockerfile): run the command as the app user `mtfl` (uid 1000).
#
# Started as root (the images' default user), it first hands the app user the folders it writes
# that it does not own yet: a host folder bind-mounted there (ARTIFACT_SOURCE=/srv/mtfl, say) is
# usually root's, and the app could not write to it. Only entries not yet owned by the app user
# are changed, so a restart costs a scan, not a rewrite. Started as another user (`docker run
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
    if [ -n "$(find "$dir" ! -user "$uid" -print -quit)" ]; then
      echo "mtfl-entrypoint: giving $dir to $app_user (uid $uid)" >&2
      find "$dir" ! -user "$uid" -exec chown "$uid:$gid" {} +
    fi
  done
  # setpriv keeps the environment: HOME must be the app user's, or caches land in /root.
  HOME=$(getent passwd "$app_user" | cut -d: -f6)
  export HOME
  exec setpriv --reuid="$uid" --regid="$gid" --init-groups -- "$@"
fi
exec "$@"

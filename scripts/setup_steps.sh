# shellcheck shell=bash
# Sourced by scripts/setup.sh and scripts/setup_dev.sh: each step prints one line and sends its output to
# a log (.venv/setup.log); a step that fails prints the log's tail and stops the setup. With DRY_RUN=1 a
# step prints its command instead of running it.
SETUP_LOG=${SETUP_LOG:-.venv/setup.log}
DRY_RUN=${DRY_RUN:-0}

# step DESCRIPTION COMMAND...: run COMMAND with its output in the log.
step() {
  local what=$1
  shift
  if [ "$DRY_RUN" = 1 ]; then
    echo "setup: $what: $*"
    return 0
  fi
  mkdir -p "$(dirname "$SETUP_LOG")"
  echo "setup: $what (log: $SETUP_LOG)"
  echo "== $what: $*" >>"$SETUP_LOG"
  if ! "$@" >>"$SETUP_LOG" 2>&1; then
    echo "setup: $what failed; the end of $SETUP_LOG:" >&2
    tail -n 30 "$SETUP_LOG" >&2
    exit 1
  fi
}

# debian_step DESCRIPTION HAVE:PACKAGE...: install from Debian each PACKAGE whose HAVE (a command, or an
# absolute path) is missing; as root with apt-get, else one line naming the packages to install.
debian_step() {
  local what=$1 entry have missing=()
  shift
  for entry in "$@"; do
    have=${entry%%:*}
    if [ "$DRY_RUN" != 1 ]; then
      if [[ $have == /* ]]; then [ -e "$have" ] && continue; else command -v "$have" >/dev/null 2>&1 && continue; fi
    fi
    missing+=("${entry#*:}")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$DRY_RUN" = 1 ] || { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }; then
    step "$what" apt_get_install "${missing[@]}"
  else
    echo "setup: missing Debian packages: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
  fi
}

apt_get_install() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

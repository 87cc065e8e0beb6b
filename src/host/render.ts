// The texts `host install` writes on a gateway host, as pure functions of their inputs: the
// start and update scripts, the systemd unit, the default config.yaml, host.json and slot.json.
// Install compares each with what is on disk and writes only what differs, so the same inputs
// must always give the same bytes (no timestamps, no ordering that depends on the platform).
//
// Every value that lands in a script or the unit is checked first: a path with a newline or a
// quote could end a directive early and start another one.

import { ProxyError } from '../errors.js';
import type { HostSettings, SlotRecord } from './layout.js';

/** Characters a root or unit dir may hold: no whitespace, quotes, `$`, `%` or `\` that a shell or systemd would read. */
const SAFE_PATH = /^\/[A-Za-z0-9_.@+,:=/-]*$/;
const UNIT_NAME = /^[A-Za-z0-9_.@-]+$/;

function bad(message: string): ProxyError {
  return new ProxyError('DP_ERR_BAD_OPTION', message);
}

/** An absolute path safe to write into a shell script or a unit file unquoted. */
export function checkPath(what: string, path: string): string {
  if (!path.startsWith('/')) throw bad(`${what} must be an absolute path, not ${JSON.stringify(path)}`);
  if (!SAFE_PATH.test(path)) {
    throw bad(
      `${what} ${JSON.stringify(path)} holds a character a unit file or shell script would misread (allowed: letters, digits, _ . @ + , : = / -)`,
    );
  }
  return path.length > 1 && path.endsWith('/') ? path.replace(/\/+$/, '') : path;
}

export function checkUnitName(name: string): string {
  if (!UNIT_NAME.test(name) || name.endsWith('.service')) {
    throw bad(`unit name ${JSON.stringify(name)} must match ${UNIT_NAME.source} (without .service)`);
  }
  return name;
}

/** One argument of a systemctl argv: anything but control characters (it is never given to a shell). */
function checkArg(what: string, value: string): string {
  if (value === '' || /[\u0000-\u001f\u007f]/.test(value))
    throw bad(`${what} ${JSON.stringify(value)} is empty or holds a control character`);
  return value;
}

/** Seconds a stopped gateway serves on for a restart's new one (it starts once the stop returned). */
export const SUCCESSOR_WAIT_SECONDS = 15;

/** A gateway that ran this long before it ended on its own is started again at once. */
export const CRASH_RESTART_AFTER_SECONDS = 10;

/**
 * The script the unit runs, its main process: the active slot's gateway on the host's config,
 * always with `--take-over true`, so whichever way a new gateway starts (a reload, a restart,
 * a crash) it serves before the old one stops, and no request is dropped. A plain POSIX sh, so
 * it never changes with a slot.
 */
export function renderStartScript(root: string): string {
  root = checkPath('the host root', root);
  return `#!/bin/sh
# The gateway unit's main process. Written by \`dstack-proxy host install\`: edits are replaced
# on the next install or update.
#   - Runs the active slot's gateway, named in $root/version (blue when there is none yet), with
#     --take-over true: when a gateway still serves this host (a restart's old one), the new one
#     converges beside it, takes Nginx's data plane over, then tells the old one to stop.
#   - SIGHUP (\`systemctl reload\`, what \`host update\` and \`host rollback\` send): starts the
#     active slot's gateway again beside the running one, the same way. A new one that fails
#     before it took over leaves the old one serving.
#   - SIGTERM/SIGINT (\`systemctl stop\`, the first half of a restart): passed to every gateway it
#     started, and this script exits at once. A gateway told to stop goes on whole (its API
#     included) for up to ${SUCCESSOR_WAIT_SECONDS} s more, until a new one takes over (the restart's second half),
#     then finishes what it has in flight (at most its drain period) and exits.
#   - The serving gateway ending on its own after ${CRASH_RESTART_AFTER_SECONDS} s or more is started again at once; one
#     ending sooner ends this script with its status, for systemd to restart the unit.
set -u
root='${root}'
cd "$root" || exit 1

# The active slot in $slot; false when $root/version names neither.
active() {
  slot=blue
  if [ -f "$root/version" ]; then
    read -r slot <"$root/version" || true
  fi
  case "$slot" in
    blue | green) return 0 ;;
  esac
  echo "$root/version holds '$slot', not blue or green" >&2
  return 1
}

# Starts the active slot's gateway; its pid in $pid, when in $since.
gateway() {
  "$root/$slot/node" "$root/$slot/node_modules/dstack-proxy/dist/src/cli.js" gateway --config "$root/config.yaml" \\
    --take-over true --successor-wait ${SUCCESSOR_WAIT_SECONDS} &
  pid=$!
  since=$(date +%s)
}

active || exit 1
gateway
# The gateway a take-over started from, while the new one has not proved itself.
prev=''
reload=0
trap 'reload=1' HUP
trap 'kill -TERM $pid $prev 2>/dev/null; exit 0' TERM INT
while :; do
  wait "$pid"
  status=$?
  # The previous gateway is gone: the take-over went through.
  if [ -n "$prev" ] && ! kill -0 "$prev" 2>/dev/null; then
    prev=''
  fi
  if [ "$reload" = 1 ]; then
    reload=0
    if active; then
      prev=$pid
      gateway
    fi
    continue
  fi
  # A signal cut the wait short: the gateway still runs.
  if kill -0 "$pid" 2>/dev/null; then
    continue
  fi
  if [ -n "$prev" ] && kill -0 "$prev" 2>/dev/null; then
    # The take-over failed; the gateway it started from still runs.
    echo "the gateway taking over exited $status; the previous one goes on" >&2
    pid=$prev
    prev=''
    continue
  fi
  if [ $(($(date +%s) - since)) -ge ${CRASH_RESTART_AFTER_SECONDS} ] && active; then
    echo "the gateway exited $status; starting it again" >&2
    gateway
    continue
  fi
  exit "$status"
done
`;
}

/** `<root>/update <package-spec> [<version>]`: the active slot's CLI updates the host (what dstack's server runs). */
export function renderUpdateScript(root: string): string {
  root = checkPath('the host root', root);
  return `#!/bin/sh
# Updates this gateway host: \`update <package-spec> [<version>]\`, run with the active slot's
# own CLI (it installs into the other slot, checks it, switches and rolls back when the new
# one is not ready). Written by \`dstack-proxy host install\`.
set -eu
root='${root}'
active=blue
if [ -f "$root/version" ]; then
  read -r active <"$root/version" || true
fi
case "$active" in
  blue | green) ;;
  *)
    echo "$root/version holds '$active', not blue or green" >&2
    exit 1
    ;;
esac
exec "$root/$active/node" "$root/$active/node_modules/dstack-proxy/dist/src/cli.js" host update --root "$root" "$@"
`;
}

export interface UnitInput {
  root: string;
  /** Seconds systemd waits after SIGTERM before it kills: the gateway's drain plus a margin. */
  timeoutStopSec: number;
}

/** Seconds added to the drain period for the rest of a graceful stop (Nginx quit, state flush). */
export const STOP_MARGIN_SECONDS = 30;

export function stopTimeout(drainPeriodSeconds: number): number {
  return Math.ceil(Math.max(0, drainPeriodSeconds)) + STOP_MARGIN_SECONDS;
}

/**
 * The unit. WorkingDirectory carries systemd's `-` (a missing dir is no error) and the start
 * script changes into the root itself: a daemonless systemctl run with `--root=<tree>` (a
 * test's unit tree) looks the working dir up inside that tree, where the host root is not.
 *
 * The sandboxing is what the gateway's work leaves room for. It runs as root because it edits
 * the system Nginx's files (/etc/nginx), reloads it and runs certbot (/etc/letsencrypt), so
 * neither the file system nor /etc is made read-only. UMask 0077 makes everything it writes
 * private; what Nginx's workers must open is given its mode explicitly (the balancer sockets,
 * the ACME webroot), and certbot sets its challenge files' mode itself. NoNewPrivileges and
 * RestrictSUIDSGID keep any child (nginx -t, certbot, systemctl) from gaining privileges;
 * Nginx's workers only drop them. The rest closes kernel interfaces it never uses. Not set:
 * MemoryDenyWriteExecute (V8 compiles code at run time), PrivateTmp and PrivateDevices (the
 * children share /tmp and devices with the system Nginx), ProtectSystem (it writes /etc).
 */
export function renderUnit(input: UnitInput): string {
  const root = checkPath('the host root', input.root);
  if (!Number.isInteger(input.timeoutStopSec) || input.timeoutStopSec < 1) {
    throw bad(`TimeoutStopSec must be a positive whole number of seconds, not ${input.timeoutStopSec}`);
  }
  return `# Written by \`dstack-proxy host install\`: edits are replaced on the next install or update.
[Unit]
Description=dstack-proxy gateway (${root})
After=network-online.target nginx.service
Wants=network-online.target

[Service]
Type=simple
ExecStart=/bin/sh ${root}/start
# The start script hands over to a new gateway on SIGHUP, without dropping a request.
ExecReload=/bin/kill -HUP $MAINPID
# A stop signals the start script alone, which passes it on and exits: the gateway it ran
# serves on until a restart's new one takes over, and ends on its own (within its drain period
# and the wait for a successor). A process outliving the stop is what lets a restart drop nothing.
ExecStop=/bin/kill -TERM $MAINPID
KillMode=process
WorkingDirectory=-${root}
Restart=always
RestartSec=2
LimitNOFILE=65535
KillSignal=SIGTERM
TimeoutStopSec=${input.timeoutStopSec}
UMask=0077
NoNewPrivileges=yes
RestrictSUIDSGID=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictNamespaces=yes
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
`;
}

/** config.yaml for a real host: the system Nginx, state under the root. */
export function renderDefaultConfig(root: string): string {
  root = checkPath('the host root', root);
  return `# The gateway's options (camelCase keys of docs/configuration.md). Written once by
# \`dstack-proxy host install\` and kept afterwards: edit it, then restart the unit.
stateDir: ${JSON.stringify(`${root}/state`)}
nginx: system
sitesDir: /etc/nginx/dstack-proxy
nginxConf: /etc/nginx/nginx.conf
`;
}

export function renderHostSettings(settings: HostSettings): string {
  checkUnitName(settings.unitName);
  checkPath('the unit dir', settings.unitDir);
  if (settings.systemctl.length === 0) throw bad('the systemctl argv is empty');
  settings.systemctl.forEach((a) => checkArg('a systemctl argument', a));
  const out: HostSettings = { unitName: settings.unitName, unitDir: settings.unitDir, systemctl: [...settings.systemctl] };
  if (settings.runtimeFrom !== undefined) out.runtimeFrom = checkArg('--runtime-from', settings.runtimeFrom);
  return `${JSON.stringify(out, null, 2)}\n`;
}

export function renderSlotRecord(record: SlotRecord): string {
  checkArg('the package spec', record.package);
  checkArg('the runtime version', record.runtime);
  const out: SlotRecord = { package: record.package, runtime: record.runtime, installedAt: record.installedAt };
  return `${JSON.stringify(out, null, 2)}\n`;
}

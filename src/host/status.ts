// `host status`: what a gateway host runs, read from its files (version, slot.json, the
// installed package.json, host.json) and asked of systemctl and the gateway's /readyz.
// Reading never changes anything, and every part that cannot be read says why instead of
// failing the whole answer: a host with a stopped unit or a broken config still has a status.

import { ProxyError } from '../errors.js';
import { readGatewayConfig, readyUrl } from './gateway-config.js';
import { hostPaths, otherSlot, readActive, readHostSettings, readSlot, type Slot, type SlotInfo } from './layout.js';
import { systemctl, unitFile } from './systemctl.js';

export interface HostStatus {
  root: string;
  active: SlotInfo & { slot: Slot };
  /** The other slot: the previous install (what a rollback returns to), or undefined when empty. */
  previous: SlotInfo | undefined;
  previousSlot: Slot;
  unit: { name: string; state: string } | { name: string | undefined; error: string };
  ready: { url: string; status: number; body: string } | { url: string | undefined; error: string };
}

export async function hostStatus(root: string): Promise<HostStatus> {
  const paths = hostPaths(root);
  const activeSlot = await readActive(root);
  if (activeSlot === undefined) {
    throw new ProxyError('DP_ERR_NOT_FOUND', `${root} is not a gateway host: ${paths.versionFile} does not exist`);
  }
  const active = (await readSlot(root, activeSlot)) ?? { slot: activeSlot, version: '', package: '', runtime: '', installedAt: '' };
  const previousSlot = otherSlot(activeSlot);
  const previous = await readSlot(root, previousSlot);

  let unit: HostStatus['unit'];
  try {
    const settings = await readHostSettings(root);
    const name = unitFile(settings);
    const r = await systemctl(settings, ['is-active', name], 30_000);
    unit = { name, state: r.stdout.trim().split('\n').pop() || (r.exitCode === 0 ? 'active' : `is-active exited ${r.exitCode}`) };
  } catch (err) {
    unit = { name: undefined, error: (err as Error).message };
  }

  let ready: HostStatus['ready'];
  let url: string | undefined;
  try {
    url = readyUrl(readGatewayConfig(paths.configFile));
    const res = await fetch(url, { signal: AbortSignal.timeout(3000) });
    ready = { url, status: res.status, body: (await res.text()).slice(0, 200).replace(/\s+/g, ' ').trim() };
  } catch (err) {
    const cause = (err as { cause?: { code?: string } }).cause;
    ready = { url, error: cause?.code ?? (err as Error).message };
  }
  return { root, active, previous, previousSlot, unit, ready };
}

export function formatHostStatus(s: HostStatus): string {
  const slotLine = (info: SlotInfo): string =>
    `${info.version || '(unknown version)'} from ${info.package || '(unknown package)'}, node ${info.runtime || '(unknown)'}, installed ${info.installedAt || '(unknown)'}`;
  const lines = [
    `root:     ${s.root}`,
    `active:   ${s.active.slot}: ${slotLine(s.active)}`,
    `previous: ${s.previousSlot}: ${s.previous ? slotLine(s.previous) : 'empty'}`,
    'error' in s.unit ? `unit:     ${s.unit.error}` : `unit:     ${s.unit.name}: ${s.unit.state}`,
    'error' in s.ready
      ? `readyz:   ${s.ready.url ?? '(no url)'}: ${s.ready.error}`
      : `readyz:   ${s.ready.url}: ${s.ready.status}${s.ready.body ? ` ${s.ready.body}` : ''}`,
  ];
  return `${lines.join('\n')}\n`;
}

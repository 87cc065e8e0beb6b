// `GET /status`: a web page of the gateway's state for an operator's browser, on the
// management listener behind the same token as /api/v1/*. One self-contained document (no
// dependency, no external request): it reads GET /api/v1/status every second and redraws
// services (replicas with their load), certificates (expiry, last error), loops (conditions,
// failing keys) and Nginx's reloads. Everything it shows is what the status API already
// answers, so it holds no secret; values go into the page as text, never as markup.
//
// A browser cannot send a bearer token by itself: with a token set, the page's 401 asks for
// Basic credentials (any user name, the token as password), which the browser then sends with
// the page's own requests.

import { createHash } from 'node:crypto';
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';

const SCRIPT = `
const $ = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k === null || k === undefined ? '' : k instanceof Node ? k : String(k));
  return e;
};
const cond = (o, type) => (o.conditions || []).find((c) => c.type === type);
const ago = (ms) => {
  const s = Math.round(ms / 1000);
  return s < 120 ? s + ' s' : s < 7200 ? Math.round(s / 60) + ' min' : s < 172800 ? Math.round(s / 3600) + ' h' : Math.round(s / 86400) + ' days';
};
const table = (head, rows) =>
  rows.length === 0 ? $('p', { class: 'none' }, 'none') : $('table', {}, $('tr', {}, ...head.map((h) => $('th', {}, h))), ...rows);
const badge = (state) => $('span', { class: 'badge ' + state }, state);

function services(s) {
  const ssh = (s.loops.ssh && s.loops.ssh.objects) || {};
  const by = new Map();
  for (const [key, o] of Object.entries(ssh)) {
    const parts = key.split('/');
    if (parts.length !== 3) continue;
    const svc = parts[0] + '/' + parts[1];
    if (!by.has(svc)) by.set(svc, []);
    by.get(svc).push([parts[2], o]);
  }
  const rows = [];
  for (const [svc, replicas] of [...by.entries()].sort()) {
    const ready = replicas.filter(([, o]) => (cond(o, 'Ready') || {}).status === 'True').length;
    const state = ready === replicas.length ? 'healthy' : ready > 0 ? 'degraded' : 'failing';
    const detail = $('ul', {});
    for (const [id, o] of replicas.sort()) {
      const r = cond(o, 'Ready') || {};
      const load = o.load || {};
      detail.append($('li', {}, $('b', {}, id), ' ', r.status === 'True' ? 'ready' : (r.reason || 'not ready') + (r.message ? ': ' + r.message : ''),
        ' · in flight ', load.inFlight || 0, ' · requests ', load.requests || 0));
    }
    rows.push($('tr', { class: state, 'data-service': svc }, $('td', {}, svc), $('td', {}, badge(state)), $('td', {}, ready + '/' + replicas.length), $('td', {}, detail)));
  }
  return table(['service', 'state', 'ready', 'replicas'], rows);
}

function certificates(s) {
  const tls = (s.loops.tls && s.loops.tls.objects) || {};
  const rows = Object.entries(tls).sort().map(([domain, o]) => {
    const r = cond(o, 'Ready') || {};
    const out = o.outputs || {};
    const left = out.notAfter ? Date.parse(out.notAfter) - Date.now() : null;
    const state = r.status === 'True' ? (left !== null && left < 14 * 86400e3 ? 'degraded' : 'healthy') : out.failedAttempts > 0 ? 'failing' : 'pending';
    return $('tr', { class: state }, $('td', {}, domain), $('td', {}, badge(state)),
      $('td', {}, left === null ? '—' : 'expires in ' + ago(left)),
      $('td', {}, out.lastError ? out.failedAttempts + ' failed: ' + out.lastError : r.reason || ''));
  });
  return table(['domain', 'state', 'expiry', 'last word'], rows);
}

function loops(s) {
  const rows = Object.entries(s.loops).map(([name, l]) => {
    const r = cond(l, 'Ready') || {};
    const d = cond(l, 'Degraded');
    const state = r.status === 'True' ? (d && d.status === 'True' ? 'degraded' : 'healthy') : Object.keys(l.failures || {}).length ? 'failing' : 'pending';
    const failing = $('ul', {});
    for (const [key, f] of Object.entries(l.failures || {})) failing.append($('li', {}, $('b', {}, key), ' ', f.message, ' (attempt ', f.attempts, ')'));
    return $('tr', { class: state }, $('td', {}, name), $('td', {}, badge(state)), $('td', {}, (r.reason || '') + (r.message ? ': ' + r.message : '')), $('td', {}, failing));
  });
  return table(['loop', 'state', 'condition', 'failing'], rows);
}

function header(s) {
  const n = s.nginx;
  return $('p', {}, 'generation ', $('b', {}, s.generation), ' · served ', $('b', {}, s.observedGeneration), ' · ',
    s.ready ? 'ready' : 'starting',
    n ? ' · Nginx reloads ' + n.reloads + (n.reloadFailures ? ' (' + n.reloadFailures + ' failed)' : '') + (n.lastReloadAt ? ', last ' + ago(Date.now() - n.lastReloadAt) + ' ago' : '') : '',
    s.store && s.store.lastError ? ' · store: ' + s.store.lastError.message : '');
}

async function refresh() {
  const status = document.getElementById('updated');
  try {
    const r = await fetch('api/v1/status', { cache: 'no-store' });
    if (!r.ok) throw new Error('GET /api/v1/status answered ' + r.status);
    const s = await r.json();
    document.getElementById('main').replaceChildren(header(s),
      $('h2', {}, 'Services'), services(s), $('h2', {}, 'Certificates'), certificates(s), $('h2', {}, 'Loops'), loops(s));
    status.textContent = 'updated ' + new Date().toLocaleTimeString();
    status.className = '';
  } catch (err) {
    status.textContent = String(err.message || err);
    status.className = 'stale';
  }
}
refresh();
setInterval(refresh, 1000);
`;

const STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; width: 100%; } th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f4f4f4; } ul { margin: 0; padding-left: 1.1em; } .none { color: #888; }
.badge { padding: .1em .5em; border-radius: .8em; font-size: .85em; color: #fff; }
.badge.healthy { background: #2e7d32; } .badge.degraded { background: #ef8f00; } .badge.failing { background: #c62828; } .badge.pending { background: #757575; }
#updated { color: #888; } #updated.stale { color: #c62828; font-weight: bold; }
`;

const sha256 = (s: string): string => createHash('sha256').update(s).digest('base64');

const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>dstack-proxy status</title><style>${STYLE}</style></head>
<body><h1>dstack-proxy</h1><div id="updated">loading…</div><div id="main"></div><script>${SCRIPT}</script></body></html>
`;

/** Only this page's own script and style run: nothing else can be injected into it. */
const CSP = `default-src 'none'; connect-src 'self'; script-src 'sha256-${sha256(SCRIPT)}'; style-src 'sha256-${sha256(STYLE)}'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`;

export interface StatusPageOptions {
  guard: (request: FastifyRequest) => Promise<void>;
  /** Whether the guard asks for a token (then a 401 invites the browser's Basic prompt). */
  tokenSet: boolean;
}

export const statusPageRoutes: FastifyPluginAsync<StatusPageOptions> = async (app, { guard, tokenSet }) => {
  app.get('/status', {
    onRequest: async (request, reply) => {
      try {
        await guard(request);
      } catch (err) {
        if (tokenSet) void reply.header('www-authenticate', 'Basic realm="dstack-proxy", charset="UTF-8"');
        throw err;
      }
    },
    handler: async (_request, reply) =>
      reply
        .header('content-type', 'text/html; charset=utf-8')
        .header('content-security-policy', CSP)
        .header('cache-control', 'no-store')
        .header('x-content-type-options', 'nosniff')
        .send(PAGE),
  });
};

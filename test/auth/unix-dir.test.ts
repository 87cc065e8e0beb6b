// --server-url unix-dir:<dir>: token checks through a directory of reverse-forwarded sockets,
// one per control-server process, as dstack's server leaves them on its gateway. Real Unix
// sockets, a fastify app per live one; time that matters (how long a socket was refused) moves
// on a fake clock.

import { existsSync, lstatSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { request } from 'undici';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createControlServerAuth, type AuthProvider } from '../../src/auth/index.js';
import { SocketDir } from '../../src/auth/socket-dir.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { tmpDir } from '../helpers/tmp.js';
import { closingSocket, deadSocket, liveSocket, type LiveSocket } from './socket-dir.js';

let tmp: ReturnType<typeof tmpDir>;
let dir: string;
let clock: FakeClock;
let logLines: string[];
const toClose: (() => Promise<unknown>)[] = [];

beforeEach(() => {
  tmp = tmpDir('dp-auth-dir-');
  dir = join(tmp.dir, 'server-connections');
  mkdirSync(dir, { mode: 0o700 });
  clock = new FakeClock();
  logLines = [];
});

afterEach(async () => {
  for (const c of toClose.splice(0).reverse()) await c();
  tmp.cleanup();
});

function provider(over: { timeoutMs?: number; ttlMs?: number } = {}): AuthProvider {
  const logger = pino({ level: 'debug' }, new Writable({ write: (c: Buffer, _e, cb) => (logLines.push(c.toString()), cb()) }));
  const a = createControlServerAuth({
    serverUrl: `unix-dir:${dir}`,
    clock,
    logger,
    timeoutMs: over.timeoutMs ?? 3_000,
    ttlMs: over.ttlMs ?? 60_000,
  });
  toClose.push(() => a.close());
  return a;
}

async function live(name: string): Promise<LiveSocket> {
  const s = await liveSocket(join(dir, name));
  toClose.push(() => s.close());
  return s;
}

/** The log lines with message `msg`: the provider's socket directory shows itself only there. */
const logged = (msg: string) => logLines.map((l) => JSON.parse(l) as { msg: string; socket?: string }).filter((l) => l.msg === msg);

let n = 0;
const fresh = () => `member-${++n}-0123456789`;

describe('unix-dir: a directory of control-server sockets', () => {
  it('spreads checks over the live sockets, skips the dead one, and every check succeeds', async () => {
    const a = await live('a.sock');
    const b = await live('b.sock');
    await deadSocket(join(dir, 'dead.sock'));
    const auth = provider();
    for (let i = 0; i < 60; i++) expect(await auth.check('main', fresh())).toBe('allow');
    // Random spread: both got some, no exact split asked for.
    expect(a.calls.length).toBeGreaterThan(0);
    expect(b.calls.length).toBeGreaterThan(0);
    expect(a.calls.length + b.calls.length).toBe(60);
    // Tried (each check has a 1 in 3 chance to try it first while it is new), then resting:
    // one failure in all, logged once.
    const failed = logged('auth socket failed; the others are tried first for a while');
    expect(failed.map((l) => l.socket)).toEqual(['dead.sock']);
    // Not removed: refused for less than two minutes.
    expect(lstatSync(join(dir, 'dead.sock')).isSocket()).toBe(true);
  });

  it('unlinks a socket refused for two minutes (two refusals at least), and only that one', async () => {
    const a = await live('a.sock');
    const dead = join(dir, 'dead.sock');
    await deadSocket(dead);
    const sd = new SocketDir({ dir, clock, connectTimeoutMs: 3_000 });
    toClose.push(() => sd.close());
    // The question the provider asks, through whichever socket the directory picks.
    const dispatcherCheck = () =>
      sd.send(async (d) => {
        const res = await request('http://localhost/api/projects/main/get', {
          method: 'POST',
          dispatcher: d,
          headers: { authorization: `Bearer ${fresh()}` },
        });
        await res.body.dump();
        return res.statusCode;
      }, AbortSignal.timeout(3_000));
    const failuresOf = () => sd.view().find((v) => v.name === 'dead.sock')?.failures ?? 0;
    /** Checks until the dead socket was tried `k` times in all (it rests 30 s after each). */
    const untilTried = async (k: number) => {
      for (let i = 0; i < 500 && failuresOf() < k; i++) expect(await dispatcherCheck()).toBe(200);
      return failuresOf();
    };
    expect(await untilTried(1)).toBe(1);
    // Resting: a live socket is there, so the dead one is not tried again within 30 s.
    for (let i = 0; i < 50; i++) expect(await dispatcherCheck()).toBe(200);
    clock.advance(29_000);
    for (let i = 0; i < 50; i++) expect(await dispatcherCheck()).toBe(200);
    expect(failuresOf()).toBe(1);
    clock.advance(31_000);
    expect(await untilTried(2)).toBe(2);
    // Two refusals, 60 s apart: kept.
    expect(existsSync(dead)).toBe(true);
    clock.advance(61_000);
    for (let i = 0; i < 500 && existsSync(dead); i++) expect(await dispatcherCheck()).toBe(200);
    expect(existsSync(dead)).toBe(false);
    expect(sd.view().map((v) => v.name)).toEqual(['a.sock']);
    expect(lstatSync(a.path).isSocket()).toBe(true);
  });

  it('refuses every check when no socket answers (fail closed), and uses a socket that appears later', async () => {
    await deadSocket(join(dir, 'old-1.sock'));
    await deadSocket(join(dir, 'old-2.sock'));
    const auth = provider();
    const token = fresh();
    expect(await auth.check('main', token)).toBe('unavailable');
    expect(await auth.check('main', token)).toBe('unavailable');
    expect(await auth.check('main', fresh())).toBe('unavailable');
    // Logged once for the directory, once per socket; never the token.
    expect(logged('no socket answered the auth check; protected requests are refused')).toHaveLength(1);
    expect(logged('auth socket failed; the others are tried first for a while')).toHaveLength(2);
    // A new server process connects: its socket is used at once (the dead ones rest).
    const late = await live('new.sock');
    expect(await auth.check('main', token)).toBe('allow');
    expect(late.calls).toEqual([`main ${token}`]);
    expect(logged('a socket answers the auth checks again')).toHaveLength(1);
    expect(await auth.check('main', 'not-a-member')).toBe('deny');
    expect(logLines.join('')).not.toContain(token);
  });

  it('with every socket dead for two minutes, both files are unlinked and checks stay refused', async () => {
    await deadSocket(join(dir, 'old-1.sock'));
    await deadSocket(join(dir, 'old-2.sock'));
    const auth = provider();
    expect(await auth.check('main', fresh())).toBe('unavailable');
    clock.advance(120_000);
    expect(await auth.check('main', fresh())).toBe('unavailable');
    expect(existsSync(join(dir, 'old-1.sock'))).toBe(false);
    expect(existsSync(join(dir, 'old-2.sock'))).toBe(false);
    expect(logged('removed a stale auth socket (its connects were refused for minutes)')).toHaveLength(2);
    // An empty directory, and one that is gone: refused, no crash.
    expect(await auth.check('main', fresh())).toBe('unavailable');
    tmp.cleanup();
    expect(await auth.check('main', fresh())).toBe('unavailable');
  });

  it('caches a member: a repeated token asks no socket again until the TTL ends', async () => {
    const a = await live('a.sock');
    const b = await live('b.sock');
    const auth = provider({ ttlMs: 60_000 });
    const token = fresh();
    expect(await auth.check('main', token)).toBe('allow');
    expect(await auth.check('main', token)).toBe('allow');
    expect(await Promise.all([1, 2, 3].map(() => auth.check('main', token)))).toEqual(['allow', 'allow', 'allow']);
    expect(a.calls.length + b.calls.length).toBe(1);
    // Refusals are not cached.
    expect(await auth.check('main', 'outsider')).toBe('deny');
    expect(await auth.check('main', 'outsider')).toBe('deny');
    expect(a.calls.length + b.calls.length).toBe(3);
    clock.advance(60_001);
    expect(await auth.check('main', token)).toBe('allow');
    expect(a.calls.length + b.calls.length).toBe(4);
  });

  it('never connects to nor unlinks a non-socket file, a symlink or a directory named *.sock', async () => {
    // A live socket outside the directory, reachable only through a symlink inside it.
    const outside = await liveSocket(join(tmp.dir, 'outside.sock'));
    toClose.push(() => outside.close());
    symlinkSync(outside.path, join(dir, 'link.sock'));
    writeFileSync(join(dir, 'file.sock'), 'not a socket');
    mkdirSync(join(dir, 'sub.sock'));
    await deadSocket(join(dir, 'dead.sock'));
    const auth = provider();
    expect(await auth.check('main', fresh())).toBe('unavailable');
    clock.advance(121_000);
    expect(await auth.check('main', fresh())).toBe('unavailable');
    expect(outside.calls).toEqual([]);
    expect(existsSync(join(dir, 'dead.sock'))).toBe(false);
    expect(lstatSync(join(dir, 'link.sock')).isSymbolicLink()).toBe(true);
    expect(lstatSync(join(dir, 'file.sock')).isFile()).toBe(true);
    expect(lstatSync(join(dir, 'sub.sock')).isDirectory()).toBe(true);
    // Only ever the dead socket was tried and logged.
    expect(logged('auth socket failed; the others are tried first for a while').map((l) => l.socket)).toEqual(['dead.sock']);
  });

  it('moves on from a socket that closes without an answer, and keeps it (it accepted)', async () => {
    const closing = await closingSocket(join(dir, 'closing.sock'));
    toClose.push(() => closing.close());
    const a = await live('a.sock');
    const auth = provider();
    for (let i = 0; i < 30; i++) expect(await auth.check('main', fresh())).toBe('allow');
    expect(a.calls.length).toBe(30);
    expect(closing.accepted()).toBe(1);
    clock.advance(10 * 60_000);
    for (let i = 0; i < 30; i++) expect(await auth.check('main', fresh())).toBe('allow');
    expect(existsSync(join(dir, 'closing.sock'))).toBe(true);
  });

  it('a socket that does not answer in time spends the check; the next one asks the others first', async () => {
    const hung = await live('hung.sock');
    const auth = provider({ timeoutMs: 300 });
    expect(await auth.check('main', 'hang')).toBe('unavailable');
    expect(hung.calls).toEqual(['main hang']);
    const a = await live('a.sock');
    const token = fresh();
    expect(await auth.check('main', token)).toBe('allow');
    expect(a.calls).toEqual([`main ${token}`]);
    expect(hung.calls).toHaveLength(1);
  });

  it('refuses a relative directory at the door', () => {
    expect(() => createControlServerAuth({ serverUrl: 'unix-dir:relative/dir' })).toThrow(/server-url/);
    expect(() => createControlServerAuth({ serverUrl: 'unix-dir:' })).toThrow(/server-url/);
  });
});

describe('project names', () => {
  it('asks for every name the document accepts (a leading - or _ included), refuses others unasked', async () => {
    const a = await live('a.sock');
    const auth = provider();
    const ok = ['main', '-lead', '_x', 'A-b_9', 'p'.repeat(64)];
    for (const p of ok) expect(await auth.check(p, fresh()), p).toBe('allow');
    expect(a.calls.map((c) => c.split(' ')[0])).toEqual(ok);
    for (const p of ['', 'p'.repeat(65), 'a.b', '..', '.', 'a/b', 'a%2fb', 'a b', 'é']) {
      expect(await auth.check(p, fresh()), p).toBe('deny');
    }
    expect(a.calls).toHaveLength(ok.length);
  });
});

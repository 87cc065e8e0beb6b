import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/errors.js';
import { hashSpec, loadDocument, wholeTextHash, type ProxyState } from '../../src/spec/index.js';
import { STATE_FILE, openFileStore } from '../../src/state/file-store.js';
import { openWatchedFileStore } from '../../src/state/watched-file-store.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { tmpDir } from '../helpers/tmp.js';
import { turns, turnsUntil } from './turns.js';

const docA = loadDocument(readFileSync('examples/local-state.yaml', 'utf8'));
const docB: ProxyState = { ...docA, spec: { ...docA.spec, services: [] } };

describe('file state store', () => {
  let t: ReturnType<typeof tmpDir>;
  let stateDir: string;
  beforeEach(() => {
    t = tmpDir();
    stateDir = path.join(t.dir, 'state');
  });
  afterEach(() => t.cleanup());

  it('starts at generation 0 with an empty document when there is no file', async () => {
    const store = await openFileStore({ stateDir });
    const s = await store.read();
    expect(s.generation).toBe(0);
    expect(s.state.spec.services).toEqual([]);
    expect(statSync(stateDir).mode & 0o777).toBe(0o700);
  });

  it('writes 0600, bumps the generation, and survives a reopen', async () => {
    const store = await openFileStore({ stateDir });
    const w = await store.write(docA);
    expect(w).toMatchObject({ changed: true, generation: 1 });
    const file = path.join(stateDir, STATE_FILE);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const reopened = await openFileStore({ stateDir });
    const s = await reopened.read();
    expect(s.generation).toBe(1);
    expect(s.hash).toBe(w.hash);
    expect(s.state).toEqual(docA);
  });

  it('does nothing for an equal hash: no write, same generation', async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    const file = path.join(stateDir, STATE_FILE);
    const before = statSync(file, { bigint: true }).mtimeNs;
    const inode = statSync(file).ino;
    const again = await store.write(structuredClone(docA));
    expect(again).toMatchObject({ changed: false, generation: 1 });
    expect(statSync(file).ino).toBe(inode);
    expect(statSync(file, { bigint: true }).mtimeNs).toBe(before);
  });

  it('refuses a stale If-Match and accepts the current one', async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    await expect(store.write(docB, { ifMatch: 0 })).rejects.toMatchObject({ code: 'DP_ERR_GENERATION_MISMATCH', status: 409 });
    await expect(store.write(docB, { ifMatch: 1 })).resolves.toMatchObject({ changed: true, generation: 2 });
  });

  it('serialises concurrent writers with If-Match: exactly one wins', async () => {
    const store = await openFileStore({ stateDir });
    const docs = Array.from({ length: 10 }, (_, i) => ({
      ...docA,
      spec: { ...docA.spec, services: docA.spec.services.map((s) => ({ ...s, clientMaxBodySize: 1000 + i })) },
    }));
    const results = await Promise.allSettled(docs.map((d) => store.write(d, { ifMatch: 0 })));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    expect((await store.read()).generation).toBe(1);
  });

  it('keeps the old state readable when a write is interrupted before the rename', async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    const crashing = await openFileStore({
      stateDir,
      beforeRename: () => {
        throw new Error('power cut');
      },
    });
    await expect(crashing.write(docB)).rejects.toThrow('power cut');
    const s = await (await openFileStore({ stateDir })).read();
    expect(s.generation).toBe(1);
    expect(s.state).toEqual(docA);
    expect(readdirSync(stateDir)).toEqual([STATE_FILE]);
  });

  it('shares one file write among writes that arrive while one is in flight, each with its own generation', async () => {
    let renames = 0;
    const store = await openFileStore({ stateDir, beforeRename: () => void renames++ });
    const docs = Array.from({ length: 10 }, (_, i) => ({
      ...docA,
      spec: { ...docA.spec, services: docA.spec.services.map((s) => ({ ...s, clientMaxBodySize: 1000 + i })) },
    }));
    const results = await Promise.all(docs.map((d) => store.write(d)));
    expect(results.map((r) => r.generation)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect(results.every((r) => r.changed)).toBe(true);
    expect(renames).toBeLessThan(10);
    const s = await (await openFileStore({ stateDir })).read();
    expect(s).toMatchObject({ generation: 10, hash: results[9]!.hash });
    expect(s.state).toEqual(docs[9]);
  });

  it('answers a no-op and If-Match against the newest accepted write, and only once it is on disk', async () => {
    const store = await openFileStore({ stateDir });
    const first = store.write(docA);
    const again = store.write(structuredClone(docA));
    const conditional = store.write(docB, { ifMatch: 1 });
    await expect(store.write(docB, { ifMatch: 0 })).rejects.toMatchObject({ code: 'DP_ERR_GENERATION_MISMATCH' });
    await expect(first).resolves.toMatchObject({ changed: true, generation: 1 });
    await expect(again).resolves.toMatchObject({ changed: false, generation: 1 });
    await expect(conditional).resolves.toMatchObject({ changed: true, generation: 2 });
    expect((await store.read()).generation).toBe(2);
  });

  it('acknowledges nobody of a group whose write crashes before the rename, nor anyone after, and keeps the file', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let renames = 0;
    const store = await openFileStore({
      stateDir,
      beforeRename: async () => {
        renames++;
        if (renames === 1) return held; // the first group's write waits here while the next group forms
        throw new Error('power cut');
      },
    });
    const docs = Array.from({ length: 4 }, (_, i) => ({
      ...docA,
      spec: { ...docA.spec, services: docA.spec.services.map((s) => ({ ...s, clientMaxBodySize: 2000 + i })) },
    }));
    const first = store.write(docs[0]!);
    await new Promise((r) => setImmediate(r));
    const group = docs.slice(1).map((d) => store.write(d));
    release();
    await expect(first).resolves.toMatchObject({ generation: 1 });
    for (const w of group) await expect(w).rejects.toThrow('power cut');
    expect(renames).toBe(2);
    // The store is back at the generation on disk.
    expect((await store.read()).generation).toBe(1);
    const s = await (await openFileStore({ stateDir })).read();
    expect(s.generation).toBe(1);
    expect(s.state).toEqual(docs[0]);
    expect(readdirSync(stateDir)).toEqual([STATE_FILE]);
  });

  it('removes temp files a crash left behind, keeping the state', async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    // No process has that pid (above Linux's largest pid_max).
    writeFileSync(path.join(stateDir, '.state.json.tmp-99999999-abc'), '{"half":');
    const s = await (await openFileStore({ stateDir })).read();
    expect(s.generation).toBe(1);
    expect(readdirSync(stateDir)).toEqual([STATE_FILE]);
  });

  it("leaves a live process's temp file alone (a gateway taken over from, writing)", async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    const theirs = `.state.json.tmp-${process.ppid}-abc`;
    writeFileSync(path.join(stateDir, theirs), '{"half":');
    await openFileStore({ stateDir });
    expect(readdirSync(stateDir).sort()).toEqual([theirs, STATE_FILE].sort());
  });

  it.each([
    ['not JSON', '{"apiVersion": "proxy.dstack.ai/v1alpha1", "kind":', /not JSON/],
    ['an array', '[]', /not a JSON object/],
    [
      'a repeated key',
      '{"apiVersion": "proxy.dstack.ai/v1alpha1", "kind": "ProxyState", "kind": "ProxyState", "spec": {}}',
      /\/kind: not JSON: the key "kind" appears twice/,
    ],
    ['no generation', JSON.stringify({ ...docA }), /metadata.generation/],
    ['an invalid document', JSON.stringify({ ...docA, kind: 'Nope', metadata: { generation: 1, hash: 'x' } }), /\/kind/],
  ])('names the file when it is corrupt: %s', async (_what, text, why) => {
    const { mkdirSync } = await import('node:fs');
    mkdirSync(stateDir, { recursive: true });
    const file = path.join(stateDir, STATE_FILE);
    writeFileSync(file, text);
    const err = await openFileStore({ stateDir }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProxyError);
    expect((err as ProxyError).code).toBe('DP_ERR_STATE_CORRUPT');
    expect((err as Error).message).toContain(file);
    expect((err as Error).message).toMatch(why);
  });

  it.each([
    ['an eabHmacKey with a trailing newline', (secret: string) => ({ acme: { eabKid: 'k', eabHmacKey: `${secret}\n` } })],
    ['an eabHmacKey with a bad character', (secret: string) => ({ acme: { eabKid: 'k', eabHmacKey: `${secret}*` } })],
    ['an eabHmacKey over 512 characters', (secret: string) => ({ acme: { eabKid: 'k', eabHmacKey: secret.repeat(20) } })],
    ['an sshPrivateKey that is not a string', (secret: string) => ({ projects: [{ name: 'p', sshPrivateKey: [secret] }] })],
  ])('a hand-edited state.json with %s is refused without quoting the secret', async (_what, spec) => {
    const secret = 'Zq8xW3kP9vL2mN7bT4yR6cH1jF5gD0sAuE';
    const { mkdirSync } = await import('node:fs');
    mkdirSync(stateDir, { recursive: true });
    const doc = { apiVersion: docA.apiVersion, kind: docA.kind, metadata: { generation: 2, hash: 'x' }, spec: spec(secret) };
    writeFileSync(path.join(stateDir, STATE_FILE), JSON.stringify(doc));
    const err = (await openFileStore({ stateDir }).catch((e: unknown) => e)) as ProxyError;
    expect(err.code).toBe('DP_ERR_STATE_CORRUPT');
    expect(err.message).toMatch(/\/spec\/(acme\/eabHmacKey|projects\/0\/sshPrivateKey)/);
    const leaked = [...Array(secret.length - 3).keys()].map((i) => secret.slice(i, i + 4)).filter((w) => err.message.includes(w));
    expect(leaked).toEqual([]);
  });

  it('refuses a hand-edited file whose hash no longer matches', async () => {
    const store = await openFileStore({ stateDir });
    await store.write(docA);
    const file = path.join(stateDir, STATE_FILE);
    writeFileSync(file, readFileSync(file, 'utf8').replace('"hello"', '"hallo"'));
    await expect(openFileStore({ stateDir })).rejects.toThrow(/metadata.hash does not match/);
  });

  it('opens a file carrying the whole-text hash of earlier versions, and stores the current form at the next write', async () => {
    const store = await openFileStore({ stateDir });
    const first = await store.write(docA);
    const file = path.join(stateDir, STATE_FILE);
    const legacy = wholeTextHash(first.state);
    writeFileSync(file, readFileSync(file, 'utf8').replace(first.hash, legacy));
    const reopened = await openFileStore({ stateDir });
    const read = await reopened.read();
    expect(read.generation).toBe(first.generation);
    expect(read.hash).toBe(hashSpec(read.state));
    // The same document again is no change: the hash compared is the current form.
    expect((await reopened.write(docA)).changed).toBe(false);
    await reopened.write(docB);
    expect(readFileSync(file, 'utf8')).toContain(hashSpec(docB));
    expect(readFileSync(file, 'utf8')).not.toContain(legacy);
  });

  // The watched store's poll runs on the injected clock: a change made behind its back (another
  // instance writing the same directory) shows once the clock has moved by pollMs.
  it('stats state.json on its clock while watched, and picks up a change made behind its back after pollMs', async () => {
    const clock = new FakeClock();
    const store = await openWatchedFileStore({ stateDir, pollMs: 60_000, clock });
    expect(clock.pendingTimers()).toBe(0); // nobody watches yet
    const seen: number[] = [];
    const stop = store.watch((s) => seen.push(s.generation));
    expect(clock.pendingTimers()).toBe(1);

    const other = await openWatchedFileStore({ stateDir });
    await other.write(docA);
    await other.close();
    clock.advance(59_999);
    await turns();
    expect(seen).toEqual([]);

    clock.advance(1);
    await turnsUntil(() => seen.length > 0, 'the poll picks up the new state.json');
    expect(seen).toEqual([1]);
    expect(store.health()).toMatchObject({ generation: 1, lastError: undefined });

    stop();
    expect(clock.pendingTimers()).toBe(0);
    store.watch(() => undefined);
    expect(clock.pendingTimers()).toBe(1);
    await store.close();
    expect(clock.pendingTimers()).toBe(0);
  });
});

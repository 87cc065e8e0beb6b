// Pebble, the ACME test server, on free loopback ports: its listener
// certificate made with openssl, PEBBLE_VA_ALWAYS_VALID=1 (no HTTP-01 fetch), -dnsserver on an
// unused loopback port so nothing leaves the machine, stopped by its PID. `eab` starts it with
// externalAccountBindingRequired and the given kid → base64url HMAC keys.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { freePorts } from './ports.js';

export interface TestPebble {
  dir: string;
  /** The ACME directory URL, e.g. https://127.0.0.1:14000/dir */
  directoryUrl: string;
  port: number;
  managementPort: number;
  /** The listener CA (what certbot needs in REQUESTS_CA_BUNDLE). */
  caPath: string;
  pid: () => number | undefined;
  /** The root that signs issued certificates (new at every start). */
  rootPem: () => Promise<string>;
  /** Stops the process by PID and waits for it to exit. Idempotent. */
  stop: () => Promise<void>;
  /** Starts it again on the same ports and config (a fresh ACME state). */
  start: () => Promise<void>;
  /** stop() and remove the directory. */
  destroy: () => Promise<void>;
}

/**
 * `validateAt`: Pebble really validates HTTP-01 challenges on that port of 127.0.0.1 (its own
 * DNS, pebble-challtestsrv, answers 127.0.0.1 for every name); without it every challenge
 * passes unasked.
 */
export async function startPebble(opts: { eab?: Record<string, string>; validateAt?: number } = {}): Promise<TestPebble> {
  const dir = await mkdtemp(join(tmpdir(), 'dp-pebble-'));
  const [port, managementPort, freeHttpPort, tlsPort, dnsPort, dnsManagementPort] = (await freePorts(6)) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  const httpPort = opts.validateAt ?? freeHttpPort;
  const caPath = join(dir, 'ca.pem');
  await makeListenerCert(dir);
  const config = {
    pebble: {
      listenAddress: `127.0.0.1:${port}`,
      managementListenAddress: `127.0.0.1:${managementPort}`,
      certificate: join(dir, 'cert.pem'),
      privateKey: join(dir, 'key.pem'),
      httpPort,
      tlsPort,
      ocspResponderURL: '',
      externalAccountBindingRequired: opts.eab !== undefined,
      ...(opts.eab ? { externalAccountMACKeys: opts.eab } : {}),
    },
  };
  const configPath = join(dir, 'pebble-config.json');
  await writeFile(configPath, JSON.stringify(config));
  const ca = await readFile(caPath, 'utf8');
  const directoryUrl = `https://127.0.0.1:${port}/dir`;
  let child: ChildProcess | null = null;
  let exited: Promise<void> = Promise.resolve();
  const dns =
    opts.validateAt === undefined
      ? null
      : spawn(
          'pebble-challtestsrv',
          [
            ...['-defaultIPv4', '127.0.0.1', '-defaultIPv6', '', '-dns01', `127.0.0.1:${dnsPort}`],
            ...['-http01', '', '-https01', '', '-tlsalpn01', '', '-management', `127.0.0.1:${dnsManagementPort}`],
          ],
          { stdio: 'ignore' },
        );

  const start = async (): Promise<void> => {
    if (child) return;
    const c = spawn('pebble', ['-config', configPath, '-dnsserver', `127.0.0.1:${dnsPort}`], {
      cwd: dir,
      env: {
        ...process.env,
        PEBBLE_VA_ALWAYS_VALID: opts.validateAt === undefined ? '1' : '0',
        PEBBLE_VA_NOSLEEP: '1',
        PEBBLE_WFE_NONCEREJECT: '0',
      },
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    child = c;
    exited = new Promise((resolve) => c.once('exit', () => resolve()));
    const deadline = Date.now() + 15_000;
    for (;;) {
      if (c.exitCode !== null) throw new Error(`pebble exited with ${c.exitCode}`);
      if ((await get(port, '/dir', ca).catch(() => null)) !== null) return;
      if (Date.now() > deadline) throw new Error('pebble did not answer within 15 s');
      await new Promise((r) => setTimeout(r, 50));
    }
  };

  const stop = async (): Promise<void> => {
    const c = child;
    if (!c) return;
    child = null;
    if (c.exitCode === null && c.pid !== undefined) process.kill(c.pid, 'SIGTERM');
    await exited;
  };

  await start();
  return {
    dir,
    directoryUrl,
    port,
    managementPort,
    caPath,
    pid: () => child?.pid,
    rootPem: async () => {
      const body = await get(managementPort, '/roots/0', ca);
      if (body === null) throw new Error('pebble management API did not answer');
      return body;
    },
    stop,
    start,
    destroy: async () => {
      await stop();
      dns?.kill('SIGTERM');
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function makeListenerCert(dir: string): Promise<void> {
  const o = { cwd: dir };
  await execa(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
      '-days',
      '3650',
      '-subj',
      '/CN=test pebble listener CA',
    ],
    o,
  );
  await execa(
    'openssl',
    [
      'req',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      'key.pem',
      '-out',
      'req.csr',
      '-subj',
      '/CN=localhost',
    ],
    o,
  );
  await writeFile(
    join(dir, 'ext.cnf'),
    'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n',
  );
  await execa(
    'openssl',
    [
      'x509',
      '-req',
      '-in',
      'req.csr',
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      'cert.pem',
      '-days',
      '3650',
      '-extfile',
      'ext.cnf',
    ],
    o,
  );
}

/** GET over HTTPS trusting `ca`; the body on 200, else null. */
function get(port: number, path: string, ca: string): Promise<string | null> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, ca, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve(res.statusCode === 200 ? Buffer.concat(chunks).toString('utf8') : null));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

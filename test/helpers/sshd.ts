// A real OpenSSH sshd (the system's /usr/sbin/sshd) on a free 127.0.0.1 port, keys generated per run,
// stopped by PID. `startSshdChain(n)` starts n of them that share one client key: a jump chain.

import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { userInfo } from 'node:os';
import { freePort } from './ports.js';
import { eventually } from './nginx.js';

export interface ClientKey {
  /** OpenSSH private key text. */
  privateKey: string;
  publicKey: string;
}

export interface TestSshd {
  port: number;
  dir: string;
  user: string;
  pid: number;
  /** SHA256:… of the current host key. */
  fingerprint: () => string;
  /** "Accepted publickey" lines in the log so far: SSH logins this sshd accepted. */
  accepted: () => number;
  /** SIGKILL the master and every session process. */
  kill: () => Promise<void>;
  /** SIGSTOP / SIGCONT the master and every session process (a host that stops answering). */
  pause: () => void;
  resume: () => void;
  /** Start again on the same port; `newHostKey` makes a fresh host key first. */
  restart: (opts?: { newHostKey?: boolean }) => Promise<void>;
  stop: () => Promise<void>;
}

export function generateKey(path: string): ClientKey {
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', path]);
  return { privateKey: readFileSync(path, 'utf8'), publicKey: readFileSync(`${path}.pub`, 'utf8') };
}

export async function startSshd(opts: { dir: string; authorizedKeys: string[]; port?: number }): Promise<TestSshd> {
  mkdirSync('/run/sshd', { recursive: true, mode: 0o755 });
  mkdirSync(opts.dir, { recursive: true });
  const port = opts.port ?? (await freePort());
  const hostKey = join(opts.dir, 'host_ed25519');
  const logPath = join(opts.dir, 'sshd.log');
  const newHostKey = (): void => {
    rmSync(hostKey, { force: true });
    rmSync(`${hostKey}.pub`, { force: true });
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', hostKey]);
  };
  newHostKey();
  writeFileSync(join(opts.dir, 'authorized_keys'), opts.authorizedKeys.join(''));
  const conf = join(opts.dir, 'sshd_config');
  writeFileSync(
    conf,
    [
      `Port ${port}`,
      'ListenAddress 127.0.0.1',
      `HostKey ${hostKey}`,
      `PidFile ${join(opts.dir, 'sshd.pid')}`,
      `AuthorizedKeysFile ${join(opts.dir, 'authorized_keys')}`,
      'PubkeyAuthentication yes',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'PermitRootLogin prohibit-password',
      'UsePAM no',
      'AllowTcpForwarding yes',
      'StrictModes no',
      'MaxStartups 100:30:200',
      'MaxSessions 100',
      'LogLevel VERBOSE',
      '',
    ].join('\n'),
  );
  let child: ChildProcess | null = null;
  const run = async (): Promise<void> => {
    child = spawn('/usr/sbin/sshd', ['-D', '-f', conf, '-E', logPath], { stdio: 'ignore' });
    await eventually(() => banner(port), 10_000);
  };
  const tree = (): number[] => (child?.pid ? [child.pid, ...descendants(child.pid)] : []);
  const signal = (sig: NodeJS.Signals): void => {
    for (const pid of tree()) {
      try {
        process.kill(pid, sig);
      } catch {
        // already gone
      }
    }
  };
  const kill = async (): Promise<void> => {
    const c = child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    const exited = new Promise<void>((r) => c.once('exit', () => r()));
    signal('SIGCONT');
    signal('SIGKILL');
    await exited;
  };
  await run();
  return {
    port,
    dir: opts.dir,
    user: userInfo().username,
    get pid() {
      return child?.pid ?? 0;
    },
    fingerprint: () => execFileSync('ssh-keygen', ['-lf', `${hostKey}.pub`], { encoding: 'utf8' }).split(' ')[1] ?? '',
    accepted: () =>
      existsSync(logPath)
        ? readFileSync(logPath, 'utf8')
            .split('\n')
            .filter((l) => l.includes('Accepted publickey')).length
        : 0,
    kill,
    pause: () => signal('SIGSTOP'),
    resume: () => signal('SIGCONT'),
    restart: async (o = {}) => {
      await kill();
      if (o.newHostKey) newHostKey();
      await run();
    },
    stop: kill,
  };
}

/** n sshds sharing one client key; hop i reaches hop i+1 at 127.0.0.1:<port>. */
export async function startSshdChain(dir: string, n: number): Promise<{ key: ClientKey; sshds: TestSshd[]; stop: () => Promise<void> }> {
  mkdirSync(dir, { recursive: true });
  const key = generateKey(join(dir, 'client_ed25519'));
  const sshds: TestSshd[] = [];
  for (let i = 0; i < n; i++) sshds.push(await startSshd({ dir: join(dir, `sshd${i}`), authorizedKeys: [key.publicKey] }));
  return { key, sshds, stop: async () => void (await Promise.all(sshds.map((s) => s.stop()))) };
}

function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const list = children.get(ppid) ?? [];
      list.push(Number(name));
      children.set(ppid, list);
    } catch {
      // exited meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number): void => {
    for (const c of children.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

function banner(port: number): Promise<true | undefined> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.setTimeout(1_000, () => s.destroy());
    s.once('data', (d: Buffer) => {
      s.destroy();
      resolve(d.toString().startsWith('SSH-') ? true : undefined);
    });
    s.once('error', () => resolve(undefined));
    s.once('close', () => resolve(undefined));
  });
}

// What /proc tells of Nginx processes: a prefix's daemons, a master's workers and whether they
// still accept, a master between reconfigurations, and stopping processes that are not ours.

import { readFile, readdir, readlink } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { NginxPaths } from './main-conf.js';

/** The pause between two looks at a process or a log: real time, and it keeps the process alive. */
export function pause(ms: number): Promise<void> {
  return new Promise<void>((r) => setTimeout(r, ms));
}

/** The master waits for signals in sigsuspend between reconfigurations (true when unknown). */
export async function masterIdle(pid: number): Promise<boolean> {
  const wchan = await readFile(`/proc/${pid}/wchan`, 'utf8').catch(() => '');
  if (!/^[a-z_]/.test(wchan)) return true; // wchan hidden: cannot tell, don't wait
  return wchan.includes('sigsuspend');
}

/** PIDs whose parent is `pid` (scan of /proc). */
async function childrenOf(pid: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    // "pid (comm) state ppid ..." — comm may hold spaces, so parse after the last ')'.
    const ppid = st.slice(st.lastIndexOf(')') + 2).split(' ')[1];
    if (ppid === String(pid)) out.push(Number(name));
  }
  return out;
}

export interface ProcEntry {
  pid: number;
  ppid: number;
  /** One letter: R, S, D, Z (zombie: exited, holds nothing), … */
  state: string;
  comm: string;
  /** Start time in clock ticks since boot: tells a pid apart from a later process reusing it. */
  startTime: string;
}

export async function procEntry(pid: number): Promise<ProcEntry | null> {
  const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  const close = st.lastIndexOf(')');
  if (close < 0) return null;
  // "pid (comm) state ppid pgrp session tty tpgid flags minflt … starttime(22nd) …"
  const rest = st.slice(close + 2).split(' ');
  return { pid, ppid: Number(rest[1]), state: rest[0] ?? '', comm: st.slice(st.indexOf('(') + 1, close), startTime: rest[19] ?? '' };
}

/** Alive and still the same process (not exited, not a zombie, pid not reused). */
async function stillRunning(p: ProcEntry): Promise<boolean> {
  const now = await procEntry(p.pid);
  return now !== null && now.state !== 'Z' && now.startTime === p.startTime;
}

/**
 * Nginx daemons (master, workers, cache processes) of this prefix: their title starts with
 * "nginx: " and they hold this prefix's error log open, or — a master — name the prefix after
 * `-p`. An `nginx -t` (raw argv, no title) and other prefixes' Nginx never match, nor does an
 * unrelated process that reused a pid from nginx.pid.
 */
export async function nginxOfPrefix(paths: NginxPaths): Promise<ProcEntry[]> {
  const out: ProcEntry[] = [];
  const log = resolve(paths.errorLogPath);
  const prefix = resolve(paths.prefix);
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const p = await procEntry(Number(name));
    if (!p || p.comm !== 'nginx' || p.state === 'Z') continue;
    const title = (await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '')).replace(/\0+$/, '');
    if (!title.startsWith('nginx: ')) continue;
    const args = title.split(/[\0 ]+/);
    const named = args.some((a, i) => a === '-p' && args[i + 1] !== undefined && resolve(args[i + 1]!) === prefix);
    if (named || (await holdsFile(p.pid, log))) out.push(p);
  }
  return out;
}

async function holdsFile(pid: number, path: string): Promise<boolean> {
  const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
  for (const fd of fds) {
    const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
    if (target === path || target === `${path} (deleted)`) return true;
  }
  return false;
}

/** SIGTERM every process, then SIGKILL what is left after graceMs; resolves once all are gone. */
export async function terminate(procs: ProcEntry[], graceMs: number): Promise<{ killed: number[]; left: number[] }> {
  const signal = async (p: ProcEntry, sig: NodeJS.Signals): Promise<void> => {
    if (!(await stillRunning(p))) return;
    try {
      process.kill(p.pid, sig);
    } catch {
      // ESRCH: gone meanwhile; EPERM: not ours to stop, reported as left below.
    }
  };
  const alive = async (): Promise<ProcEntry[]> => {
    const out: ProcEntry[] = [];
    for (const p of procs) if (await stillRunning(p)) out.push(p);
    return out;
  };
  const waitGone = async (ms: number): Promise<ProcEntry[]> => {
    const deadline = Date.now() + ms;
    for (;;) {
      const left = await alive();
      if (left.length === 0 || Date.now() > deadline) return left;
      await pause(20);
    }
  };
  for (const p of procs) await signal(p, 'SIGTERM');
  const stubborn = await waitGone(graceMs);
  for (const p of stubborn) await signal(p, 'SIGKILL');
  const left = await waitGone(graceMs);
  return { killed: stubborn.map((p) => p.pid), left: left.map((p) => p.pid) };
}

/** Workers of `master` that still accept connections: not exited, title not "shutting down". */
export async function acceptingWorkers(master: number): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await childrenOf(master)) {
    const title = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    const p = await procEntry(pid);
    if (p && p.state !== 'Z' && title.startsWith('nginx: worker process') && !title.includes('shutting down')) out.push(pid);
  }
  return out;
}

/**
 * The new generation serves alone: none of the workers that accepted before the reload still
 * does (each exited or closed its listening sockets, which it does as it takes the title
 * "worker process is shutting down"), and a worker of the new generation exists.
 */
export async function generationSwitched(master: number, old: readonly number[]): Promise<boolean> {
  const accepting = await acceptingWorkers(master);
  return accepting.length > 0 && accepting.every((w) => !old.includes(w));
}

export async function untilSwitched(master: number, old: readonly number[], deadline: number): Promise<boolean> {
  for (;;) {
    if (await generationSwitched(master, old)) return true;
    if (Date.now() > deadline) return false;
    await pause(10);
  }
}

/** The pid in an Nginx pid file, when it is a running Nginx master (else undefined). */
export async function masterFromPidFile(pidFile: string): Promise<number | undefined> {
  const pid = Number((await readFile(pidFile, 'utf8').catch(() => '')).trim());
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const title = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
  return title.startsWith('nginx: master process') ? pid : undefined;
}

// The by-host check the default server asks before it relays a host: what the host's service
// would have its site do, from the data plane's by-host routes.

import { describe, expect, it } from 'vitest';
import { hostCheck, type HostAuthorize } from '../../src/dataplane/host-check.js';
import { Replicas } from '../../src/dataplane/index.js';

describe('hostCheck', () => {
  it("answers as the host's service's site would, naming the service only when its token passed", async () => {
    const replicas = new Replicas();
    replicas.setHostRoute('main/open', { host: 'open.test', cors: false, auth: false });
    replicas.setHostRoute('main/guarded', { host: 'guarded.test', cors: false, auth: true });
    replicas.setHostRoute('main/chat', { host: 'chat.test', cors: true, auth: true });
    const asked: string[] = [];
    const authorize: HostAuthorize = async (project, authorization) => {
      asked.push(`${project} ${authorization ?? '-'}`);
      return authorization === undefined ? 'unauthenticated' : authorization === 'Bearer good' ? 'allow' : 'deny';
    };
    const check = (host: string, headers: string[] = []) => hostCheck(replicas, host, headers, authorize);

    for (const host of ['nobody.test', 'open.test'])
      expect(check(host, ['Authorization', 'Bearer good'])).toBe('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n');
    expect(asked).toEqual([]); // nothing to check: answered at once
    expect(await check('guarded.test')).toBe('HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Length: 0\r\n');
    expect(await check('guarded.test', ['Authorization', 'Bearer bad'])).toBe('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n');
    expect(await check('guarded.test', ['authorization', 'Bearer good'])).toBe(
      'HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Dstack-Proxy-Auth-Service: main/guarded\r\n',
    );
    // A model: its CORS origin on every answer; its preflight needs no token.
    expect(check('chat.test', ['X-Dstack-Proxy-Method', 'OPTIONS'])).toBe(
      'HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Dstack-Proxy-Cors: *\r\n',
    );
    expect(await check('chat.test')).toMatch(/^HTTP\/1\.1 401 [\s\S]*X-Dstack-Proxy-Cors: \*\r\n$/);
    expect(asked).toEqual(['main -', 'main Bearer bad', 'main Bearer good', 'main -']);
    // Nobody to ask, or the asking failed: 503, never a pass.
    expect(hostCheck(replicas, 'guarded.test', [], undefined)).toBe('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n');
    expect(await hostCheck(replicas, 'guarded.test', [], () => Promise.reject(new Error('down')))).toMatch(/^HTTP\/1\.1 503 /);
    await replicas.close();
  });
});

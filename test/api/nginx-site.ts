// Serve a document on a test Nginx: render every file, write it, nginx -t, reload.

import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { buildViews, renderAll } from '../../src/reconcilers/nginx/index.js';
import type { ProxyState } from '../../src/spec/types.js';
import type { TestNginx } from '../helpers/nginx.js';

/** Render the document for `ng` and serve it. */
export async function serveState(ng: TestNginx, state: ProxyState, apiUrl: string): Promise<void> {
  const files = renderAll(
    buildViews(state, {
      httpPort: ng.httpPort,
      httpsPort: ng.httpsPort,
      acmeWebroot: ng.acmeWebroot,
      accessLogPath: ng.accessLogPath,
      apiUrl,
    }),
  );
  for (const [name, text] of files) {
    const path = join(ng.paths.confDir, name);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, text);
  }
  const t = await ng.test(ng.paths.confPath);
  if (!t.ok) throw new Error(t.message);
  await ng.reload();
}

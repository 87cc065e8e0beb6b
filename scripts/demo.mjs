#!/usr/bin/env node
// `npm start`: validate the local example (the gateway daemon lands with issue 3).
import { spawnSync } from 'node:child_process';
const r = spawnSync(process.execPath, ['dist/src/cli.js', 'validate', '-f', 'examples/local-state.yaml'], { stdio: 'inherit' });
process.exit(r.status ?? 1);

// The Nginx side of the gateway as plain functions, in the order the loop (loop.ts) runs them:
//   buildViews → renderAll   (desired: the files the document asks for)
//   → diffFiles              (plan: against what observe's readOwned found in the conf dir)
//   → applyFiles             (applyBatch: nginx -t, hold back, swap, one reload).

export { buildViews, directUpstream, DEFAULT_API_URL, DEFAULT_PROXY_READ_TIMEOUT_SEC } from './view.js';
export type { CertPaths, GlobalView, SiteView, ServiceSiteView, EntrypointSiteView, UpstreamTarget, ViewOptions, Views } from './view.js';
export { MARKER, fileNameFor, renderAll, renderGlobal, renderSite } from './render.js';
export { applyFiles, CONFLICT_MESSAGE, diffFiles, readOwned, unifiedDiff, writeAtomic } from './apply.js';
export type { ApplyFilesOptions, ApplyFilesResult, FileChange, OwnedFiles, TextCache } from './apply.js';
export { mainConfText, NginxProcess, parseTestOutput, splitCommand, systemNginx, testConfig, writeMainConf } from './nginx-process.js';
export type { MainConfOptions, NginxEvent, NginxPaths, NginxProcessOptions, TestResult } from './nginx-process.js';

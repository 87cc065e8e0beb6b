// The Nginx side of the gateway as plain functions (the controller wraps them in a loop):
// buildViews → renderAll → planFiles → applyFiles (nginx -t, hold back, swap, one reload).

export { buildViews, directUpstream, DEFAULT_API_URL, DEFAULT_PROXY_READ_TIMEOUT_SEC } from './view.js';
export type { CertPaths, GlobalView, SiteView, ServiceSiteView, EntrypointSiteView, UpstreamTarget, ViewOptions, Views } from './view.js';
export { MARKER, fileNameFor, renderAll, renderGlobal, renderSite } from './render.js';
export { applyFiles, CONFLICT_MESSAGE, isEmptyPlan, planFiles, readOwned, unifiedDiff, writeAtomic } from './apply.js';
export type { ApplyOptions, ApplyResult, FilePlan } from './apply.js';
export {
  mainConfText,
  NginxProcess,
  parseTestOutput,
  splitCommand,
  systemNginx,
  testConfig,
  writeMainConf,
} from './nginx-process.js';
export type { MainConfOptions, NginxEvent, NginxPaths, NginxProcessOptions, TestResult } from './nginx-process.js';

// The Nginx loop's render of a document, each site rendered again only when what it is rendered
// from changed: a pass over 10,000 services one of which changed builds and renders one site
// view. The others cost a lookup of their service's JSON (memoised per service object, as the
// document hash does) and string compares: normalise() builds every object in one key order, so
// equal intent is equal text. Pure as far as callers can tell: the same inputs give the same files.

import { serviceJson } from '../../spec/index.js';
import type { ProxyState, Service } from '../../spec/types.js';
import { renderAll } from './render.js';
import { buildViews, type CertPaths, type UpstreamTarget, type ViewOptions } from './view.js';

export interface SiteRendersOptions {
  /** Read at every render: the API's URL is fixed up once it listens. */
  view: Omit<ViewOptions, 'certFor' | 'upstreamFor'>;
  upstreamFor?: (service: Service) => UpstreamTarget;
}

/** What a site is rendered from besides the view options; compared part by part, never joined. */
interface SiteInputs {
  /** The service or entrypoint as JSON. */
  json: string;
  /** Its certificate's paths, '' when it has none. */
  cert: string;
  /** Its upstream as JSON ('' for an entrypoint, or without upstreamFor). */
  upstream: string;
}

/** A site's file as last rendered, and what it was rendered from. */
interface RenderedSite extends SiteInputs {
  fileName: string;
  text: string;
}

export function siteRenders(o: SiteRendersOptions): {
  render(spec: ProxyState, certFor: (domain: string) => CertPaths | null): Map<string, string>;
} {
  let memo = new Map<string, RenderedSite>();
  let viewKey = '';
  return {
    render(spec, certFor) {
      // Any change to the view options renders every site again.
      const nextViewKey = JSON.stringify(o.view);
      if (nextViewKey !== viewKey) memo = new Map();
      viewKey = nextViewKey;
      const certKey = (domain: string, https: boolean): string => {
        const cert = https ? certFor(domain) : null;
        return cert ? `${cert.certPath}\0${cert.keyPath}` : '';
      };
      const next = new Map<string, RenderedSite>();
      /** The inputs of each site to render again, by domain. */
      const staleInputs = new Map<string, SiteInputs>();
      const stale: ProxyState['spec'] = { ...spec.spec, services: [], entrypoints: [] };
      const keep = (domain: string, inputs: SiteInputs): boolean => {
        const hit = memo.get(domain);
        if (hit === undefined || hit.json !== inputs.json || hit.cert !== inputs.cert || hit.upstream !== inputs.upstream) {
          staleInputs.set(domain, inputs);
          return false;
        }
        next.set(domain, hit);
        return true;
      };
      for (const s of spec.spec.services) {
        if (!s.domain) continue; // in-server only: no site
        const upstream = o.upstreamFor ? JSON.stringify(o.upstreamFor(s)) : '';
        if (!keep(s.domain, { json: serviceJson(s), cert: certKey(s.domain, s.https), upstream })) stale.services.push(s);
      }
      for (const e of spec.spec.entrypoints) {
        if (!keep(e.domain, { json: JSON.stringify(e), cert: certKey(e.domain, e.https), upstream: '' })) stale.entrypoints.push(e);
      }
      // The global file and the sites whose inputs changed, through the one view builder.
      const views = buildViews({ ...spec, spec: stale }, { ...o.view, certFor, ...(o.upstreamFor ? { upstreamFor: o.upstreamFor } : {}) });
      const fresh = renderAll(views);
      for (const site of views.sites) {
        next.set(site.domain, { ...staleInputs.get(site.domain)!, fileName: site.fileName, text: fresh.get(site.fileName)! });
      }
      memo = next;
      // As renderAll orders them: the global file, then the sites by domain.
      const files = new Map<string, string>([[views.global.fileName, fresh.get(views.global.fileName)!]]);
      for (const d of [...memo.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))) {
        const site = memo.get(d)!;
        files.set(site.fileName, site.text);
      }
      return files;
    },
  };
}

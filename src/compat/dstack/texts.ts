// dstack's own error texts, word for word: the server shows a 400's `detail` to users as a
// GatewayError, in run events and termination messages, so an unmodified server must read
// exactly what dstack's gateway would have said. Only the router text is ours (dstack's
// gateway still accepts a legacy router; the server stopped sending one).

/** `Service {p}/{r} is already registered` */
export function serviceAlreadyRegistered(project: string, run: string): string {
  return `Service ${project}/${run} is already registered`;
}

/** `Domain name '{d}' is already taken by another service` (Python's repr of the name, as dstack formats it). */
export function domainTaken(domain: string): string {
  return `Domain name ${pythonRepr(domain)} is already taken by another service`;
}

/** `Service {p}/{r} is not registered, cannot unregister` (we answer 200 instead; kept for reference and tests). */
export function serviceNotRegistered(project: string, run: string): string {
  return `Service ${project}/${run} is not registered, cannot unregister`;
}

/** `Service {p}/{r} does not exist, cannot set ID` */
export function serviceMissingCannotSetId(project: string, run: string): string {
  return `Service ${project}/${run} does not exist, cannot set ID`;
}

/** `Service {p}/{r} already has an ID` */
export function serviceAlreadyHasId(project: string, run: string): string {
  return `Service ${project}/${run} already has an ID`;
}

/** `Service {p}/{r} does not exist, cannot register replica` */
export function serviceMissingCannotRegisterReplica(project: string, run: string): string {
  return `Service ${project}/${run} does not exist, cannot register replica`;
}

/** `Replica {id} already exists in service {p}/{r}` (the server matches this text). */
export function replicaAlreadyExists(id: string, project: string, run: string): string {
  return `Replica ${id} already exists in service ${project}/${run}`;
}

/** `Cannot register replica {id} in service {p}/{r}: {reason}` */
export function cannotRegisterReplica(id: string, project: string, run: string, reason: string): string {
  return `Cannot register replica ${id} in service ${project}/${run}: ${oneLine(reason)}`;
}

/** `Service {p}/{r} does not exist, cannot unregister replica` (we answer 200 instead). */
export function serviceMissingCannotUnregisterReplica(project: string, run: string): string {
  return `Service ${project}/${run} does not exist, cannot unregister replica`;
}

/** `Replica {id} does not exist in service {p}/{r}, cannot unregister` (we answer 200 instead). */
export function replicaMissingCannotUnregister(id: string, project: string, run: string): string {
  return `Replica ${id} does not exist in service ${project}/${run}, cannot unregister`;
}

/** `Could not obtain {d} TLS certificate in {n}s. Make sure DNS records are configured for this gateway.` */
export function certificateTimedOut(domain: string, seconds: number): string {
  return `Could not obtain ${domain} TLS certificate in ${seconds}s. Make sure DNS records are configured for this gateway.`;
}

/** `Error obtaining {d} TLS certificate: {reason}`, the reason on one line as dstack flattens certbot's output. */
export function certificateFailed(domain: string, reason: string): string {
  return `Error obtaining ${domain} TLS certificate: ${oneLine(reason)}`;
}

/** A non-null `router` in a service registration: dstack dropped gateway-side routers. */
export const ROUTERS_NOT_SUPPORTED = 'Gateway-based routers are not supported';

/** Newlines to spaces, trimmed: a reason must fit one event line. */
function oneLine(text: string): string {
  return text.trim().replace(/\r?\n/g, ' ');
}

/** Python's repr() of a str for the characters a domain can hold: single quotes unless the text has one and no double quote. */
function pythonRepr(text: string): string {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  const body = text.replace(/\\/g, '\\\\').replace(quote === "'" ? /'/g : /(?!)/g, "\\'");
  return `${quote}${body}${quote}`;
}

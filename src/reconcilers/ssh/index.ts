export { createSshLoop, replicaObjectKey, SSH_LOOP, type SshLoop, type SshLoopOptions, type SshLoopStats } from './loop.js';
export { HostKeyBook, sha256Fingerprint } from './host-keys.js';
export { desiredFromSpec, describeTarget, type DesiredReplica, type DesiredSsh } from './targets.js';

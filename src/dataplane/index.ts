// The data plane's core: replicas, the per-request choice, the balancer sockets, the answers.
export { Balancer, liveDataPlane, socketPathFor, splice, type BalancerOptions, type BalancerStats } from './balancer.js';
export { SERVICE_HEADER, SHARED_SOCKET_NAME } from './service-header.js';
export { DataPlaneError, noReadyReplica, statusFor, type ClientAnswer, type DataPlaneCode } from './errors.js';
export {
  Replicas,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_CONNECTIONS_PER_REPLICA,
  DEFAULT_READ_TIMEOUT_MS,
  type ReplicaLoad,
  type ReplicasOptions,
  type ServiceOptions,
  type Upstream,
} from './replicas.js';
export type { ReplicaRouter } from './router.js';

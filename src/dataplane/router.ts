// What a front end (the in-server proxy, its WebSocket path, the model API) needs of the data
// plane: a request sent to a replica chosen per request, or a stream pinned to one replica.
// `Replicas` is one; a front end takes only this, so it cannot add or remove replicas.

import type { Replicas } from './replicas.js';

export type ReplicaRouter = Pick<Replicas, 'dispatch' | 'open'>;

// A chronoq client for Node: submit tasks, read them, and the worker calls (claim, heartbeat,
// complete, fail, release). The message and service code in ./generated is made from
// proto/chronoq/v1 by ts-proto (`npm run generate`); this file only makes it pleasant.

import { credentials, Metadata, status, type ServiceError } from "@grpc/grpc-js";
import { type Duration } from "./generated/google/protobuf/duration";
import {
  MisfirePolicy,
  type QueueCountsResponse,
  type QueueSettings,
  type Task,
  TaskServiceClient,
  TaskSpec,
  TaskState,
} from "./generated/chronoq/v1/tasks";
import { WorkerServiceClient, type HeartbeatResult, type AckResult } from "./generated/chronoq/v1/worker";

export { MisfirePolicy, TaskState, type QueueCountsResponse, type QueueSettings, type Task };

export const OCTET_STREAM = "application/octet-stream";
export const APPLICATION_JSON = "application/json";

/** Deadline of a call without one of its own, and of acks and heartbeats (milliseconds). */
const DEFAULT_TIMEOUT_MS = 30_000;
const ACK_TIMEOUT_MS = 2_500;
/** A claim's deadline is its long-poll wait plus this. */
const CLAIM_MARGIN_MS = 3_000;

/** A node refused or could not serve a call; `code` is the gRPC status name. */
export class ChronoqError extends Error {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
    this.name = "ChronoqError";
  }
}

/** Which tasks of the client's namespace a listing or a bulk operation means. */
export interface ListFilter {
  queue?: string;
  state?: TaskState;
  /** Every pair must match (at most 16). */
  labels?: Record<string, string>;
  runAtFrom?: Date;
  runAtTo?: Date;
}

export interface BulkOptions {
  /** Count the matching tasks, change none. */
  dryRun?: boolean;
  /** Stop after this many (the result's `more` says whether some are left). */
  maxTasks?: number;
}

/** Tasks changed (a dry run: matched), and whether some may be left (only with maxTasks). */
export interface BulkResult {
  count: number;
  more: boolean;
}

/** Tasks one bulk call changes at most (the node's bound). */
const MAX_BULK_TASKS = 100_000;

export interface ClientOptions {
  namespace?: string;
  /** Bearer token for nodes with auth_tokens. */
  token?: string;
  timeoutMs?: number;
}

export interface SubmitOptions {
  /** Bytes (Buffer/Uint8Array) are sent as they are; any other value as JSON. */
  payload?: unknown;
  /** Defaults: application/octet-stream for bytes, application/json for values. */
  contentType?: string;
  runAt?: Date;
  delayMs?: number;
  idempotencyKey?: string;
  maxAttempts?: number;
  leaseTimeoutMs?: number;
  priority?: number;
  /** Queue controls (the node bounds them): the queue's per-key limits count tasks by it. */
  concurrencyKey?: string;
  /** No second pending task with this key; for `uniqueForMs` after run_at when given. */
  uniqueKey?: string;
  uniqueForMs?: number;
  /** A submit with this key postpones its pending task to now + `debounceMs` (last payload
   * wins), at most `debounceMaxMs` (default 10 x debounceMs) after the first submit. */
  debounceKey?: string;
  debounceMs?: number;
  debounceMaxMs?: number;
  /** At most 16 labels; keys of [A-Za-z0-9._/-], values of at most 256 characters. */
  labels?: Record<string, string>;
}

function optionalDuration(ms: number | undefined): Duration | undefined {
  return ms === undefined ? undefined : durationOf(ms);
}

export interface Lease {
  taskId: string;
  leaseToken: number;
}

export function durationOf(ms: number): Duration {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

export function millisOf(d: Duration | undefined): number {
  return d === undefined ? 0 : d.seconds * 1000 + d.nanos / 1e6;
}

/** A payload as bytes and its content type: bytes unchanged, other values as JSON. */
export function encodePayload(value: unknown, contentType?: string): [Buffer, string] {
  if (value === undefined) return [Buffer.alloc(0), contentType ?? OCTET_STREAM];
  if (value instanceof Uint8Array) return [Buffer.from(value), contentType ?? OCTET_STREAM];
  const text = JSON.stringify(value);
  if (text === undefined) throw new ChronoqError(`payload: ${typeof value} is not JSON`, "INVALID_ARGUMENT");
  return [Buffer.from(text, "utf8"), contentType ?? APPLICATION_JSON];
}

/** What a handler reads: the value of a JSON task, else its bytes. */
export function decodePayload(task: Task): unknown {
  const mime = (task.contentType || OCTET_STREAM).split(";")[0].trim().toLowerCase();
  const json = mime === APPLICATION_JSON || (mime.startsWith("application/") && mime.endsWith("+json"));
  return json ? JSON.parse(task.payload.toString("utf8")) : task.payload;
}

type Callback<R> = (error: ServiceError | null, response: R) => void;
type Unary<Q, R> = (request: Q, metadata: Metadata, options: { deadline: Date }, callback: Callback<R>) => unknown;

export class Client {
  readonly namespace: string;
  private readonly tasks: TaskServiceClient;
  private readonly workers: WorkerServiceClient;
  private readonly metadata = new Metadata();
  private readonly timeoutMs: number;

  /** `target`: a node's host:port (plaintext; TLS is left to a fuller client). */
  constructor(target: string, options: ClientOptions = {}) {
    this.namespace = options.namespace ?? "default";
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (options.token) this.metadata.set("authorization", `Bearer ${options.token}`);
    const insecure = credentials.createInsecure();
    this.tasks = new TaskServiceClient(target, insecure);
    // One connection for both services.
    this.workers = new WorkerServiceClient(target, insecure, {
      channelOverride: this.tasks.getChannel(),
    });
  }

  close(): void {
    this.tasks.close();
  }

  private call<Q, R>(method: Unary<Q, R>, target: object, request: Q, timeoutMs?: number): Promise<R> {
    const deadline = new Date(Date.now() + (timeoutMs ?? this.timeoutMs));
    return new Promise((resolve, reject) => {
      method.call(target, request, this.metadata, { deadline }, (error, response) => {
        if (error) {
          const code = status[error.code] ?? String(error.code);
          reject(new ChronoqError(`${code}: ${error.details}`, code));
        } else {
          resolve(response);
        }
      });
    });
  }

  async submit(queue: string, options: SubmitOptions = {}): Promise<{ task: Task; created: boolean }> {
    const [payload, contentType] = encodePayload(options.payload, options.contentType);
    const spec = TaskSpec.fromPartial({
      namespace: this.namespace,
      queue,
      payload,
      contentType: contentType === OCTET_STREAM ? "" : contentType,
      idempotencyKey: options.idempotencyKey ?? "",
      priority: options.priority ?? 0,
      runAt: options.runAt,
      delay: options.runAt === undefined ? durationOf(options.delayMs ?? 0) : undefined,
      retry: options.maxAttempts === undefined ? undefined : { maxAttempts: options.maxAttempts },
      leaseTimeout: options.leaseTimeoutMs === undefined ? undefined : durationOf(options.leaseTimeoutMs),
      concurrencyKey: options.concurrencyKey ?? "",
      uniqueKey: options.uniqueKey ?? "",
      uniqueFor: optionalDuration(options.uniqueForMs),
      debounceKey: options.debounceKey ?? "",
      debounce: optionalDuration(options.debounceMs),
      debounceMax: optionalDuration(options.debounceMaxMs),
      labels: options.labels ?? {},
    });
    const reply = await this.call(this.tasks.submit as Unary<unknown, { task?: Task; created: boolean }>, this.tasks, { task: spec });
    return { task: reply.task as Task, created: reply.created };
  }

  get(id: string): Promise<Task> {
    return this.call(this.tasks.getTask as Unary<unknown, Task>, this.tasks, { namespace: this.namespace, id });
  }

  /**
   * A page of tasks ordered by id, filtered (all that are given must match): one queue, one
   * state, every one of `labels` (at most 16), run_at in [runAtFrom, runAtTo). Filtered by
   * labels or run_at, a page may hold fewer tasks than `pageSize` (even none) and still have
   * a `nextPageToken`: page on until it is empty.
   */
  async list(filter: ListFilter = {}, pageSize = 100, pageToken = ""): Promise<{ tasks: Task[]; nextPageToken: string }> {
    const request = {
      namespace: this.namespace,
      queue: filter.queue ?? "",
      state: filter.state ?? TaskState.TASK_STATE_UNSPECIFIED,
      pageSize,
      pageToken,
      labels: filter.labels ?? {},
      runAtFrom: filter.runAtFrom,
      runAtTo: filter.runAtTo,
    };
    return this.call(this.tasks.listTasks as Unary<unknown, { tasks: Task[]; nextPageToken: string }>, this.tasks, request);
  }

  /** Cancel every task the filter matches (SCHEDULED, READY, RUNNING or DEAD); the count. */
  cancelWhere(filter: ListFilter, options: BulkOptions = {}): Promise<BulkResult> {
    return this.where(this.tasks.cancelWhere, filter, options);
  }

  /** Requeue the DEAD tasks the filter matches: READY now, a fresh attempt budget. */
  requeueWhere(filter: Omit<ListFilter, "state">, options: BulkOptions = {}): Promise<BulkResult> {
    return this.where(this.tasks.requeueWhere, { ...filter, state: TaskState.TASK_STATE_DEAD }, options);
  }

  /** Run the SCHEDULED tasks the filter matches now (READY at once). */
  runNowWhere(filter: Omit<ListFilter, "state">, options: BulkOptions = {}): Promise<BulkResult> {
    return this.where(this.tasks.runNowWhere, { ...filter, state: TaskState.TASK_STATE_SCHEDULED }, options);
  }

  /** Calls again from where the node stopped (each call changes at most 100,000) until done. */
  private async where(method: unknown, filter: ListFilter, options: BulkOptions): Promise<BulkResult> {
    let count = 0;
    let pageToken = "";
    for (;;) {
      const left = options.maxTasks === undefined ? MAX_BULK_TASKS : options.maxTasks - count;
      if (left <= 0) return { count, more: true };
      const request = {
        namespace: this.namespace,
        filter: {
          queue: filter.queue ?? "",
          labels: filter.labels ?? {},
          state: filter.state ?? TaskState.TASK_STATE_UNSPECIFIED,
          runAtFrom: filter.runAtFrom,
          runAtTo: filter.runAtTo,
        },
        dryRun: options.dryRun ?? false,
        maxTasks: Math.min(left, MAX_BULK_TASKS),
        pageToken,
      };
      const reply = await this.call(
        method as Unary<unknown, { count: number; more: boolean; nextPageToken: string }>, this.tasks, request,
      );
      count += reply.count;
      pageToken = reply.nextPageToken;
      if (!reply.more) return { count, more: false };
    }
  }

  /**
   * Limit a queue per concurrency key, cluster-wide: at most `maxRunningPerKey` tasks of one
   * key running at once (0..10,000), at most `maxStartsPerKey` of one key started per second
   * (0..100,000). 0 removes a limit; a limit left out keeps its value.
   */
  setQueue(queue: string, limits: { maxRunningPerKey?: number; maxStartsPerKey?: number }): Promise<QueueSettings> {
    const request = {
      namespace: this.namespace,
      queue,
      maxRunningPerKey: limits.maxRunningPerKey,
      maxStartsPerKey: limits.maxStartsPerKey,
    };
    return this.call(this.tasks.setQueue as Unary<unknown, QueueSettings>, this.tasks, request);
  }

  /** Pause a queue cluster-wide: its due tasks still fire, no worker gets them until it resumes. */
  pauseQueue(queue: string): Promise<QueueSettings> {
    return this.call(this.tasks.pauseQueue as Unary<unknown, QueueSettings>, this.tasks, { namespace: this.namespace, queue });
  }

  /** Resume a paused queue; `skipped`: READY tasks its misfire policy (SKIP) skipped. */
  async resumeQueue(queue: string): Promise<{ queue: QueueSettings; skipped: number }> {
    const reply = await this.call(
      this.tasks.resumeQueue as Unary<unknown, { queue?: QueueSettings; skipped: number }>,
      this.tasks, { namespace: this.namespace, queue },
    );
    return { queue: reply.queue as QueueSettings, skipped: reply.skipped };
  }

  /**
   * This namespace's tasks per queue and state and each queue's oldest READY task, summed from
   * the counts the partition owners keep (cheap whatever the backlog). `asOf`: the oldest count
   * summed; `queues` (at most 100): only these; `labelKey`: also per value of that label.
   */
  queueCounts(queues: string[] = [], labelKey = ""): Promise<QueueCountsResponse> {
    const request = { namespace: this.namespace, queues, labelKey };
    return this.call(this.tasks.queueCounts as Unary<unknown, QueueCountsResponse>, this.tasks, request);
  }

  async claim(queues: string[], workerId: string, maxTasks: number, waitMs: number): Promise<Task[]> {
    const request = { namespace: this.namespace, queues, workerId, maxTasks, wait: durationOf(waitMs) };
    const reply = await this.call(
      this.workers.claim as Unary<unknown, { tasks: Task[] }>, this.workers, request, waitMs + CLAIM_MARGIN_MS,
    );
    return reply.tasks;
  }

  async heartbeat(leases: Lease[]): Promise<HeartbeatResult[]> {
    const reply = await this.call(
      this.workers.heartbeat as Unary<unknown, { results: HeartbeatResult[] }>,
      this.workers, { namespace: this.namespace, leases }, ACK_TIMEOUT_MS,
    );
    return reply.results;
  }

  complete(lease: Lease): Promise<Task> {
    return this.call(this.workers.complete as Unary<unknown, Task>, this.workers, { namespace: this.namespace, lease }, ACK_TIMEOUT_MS);
  }

  async completeMany(leases: Lease[]): Promise<AckResult[]> {
    const reply = await this.call(
      this.workers.completeBatch as Unary<unknown, { results: AckResult[] }>,
      this.workers, { namespace: this.namespace, leases }, ACK_TIMEOUT_MS,
    );
    return reply.results;
  }

  fail(lease: Lease, error: string, fatal = false): Promise<Task> {
    return this.call(
      this.workers.fail as Unary<unknown, Task>, this.workers,
      { namespace: this.namespace, lease, error, fatal }, ACK_TIMEOUT_MS,
    );
  }

  release(lease: Lease): Promise<Task> {
    return this.call(this.workers.release as Unary<unknown, Task>, this.workers, { namespace: this.namespace, lease }, ACK_TIMEOUT_MS);
  }
}

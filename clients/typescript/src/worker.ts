// A worker loop: claim ready tasks of the handled queues, run each handler, heartbeat the
// leases while they run, then complete or fail. Delivery is at least once: a handler may see
// a task again (same idempotency key) after a crash or a lost lease.

import { type Client, decodePayload, millisOf, type Lease, type Task } from "./client";

export interface TaskContext {
  task: Task;
  /** The payload decoded: the value of a JSON task, else its bytes. */
  data: unknown;
  /** Aborted when the task is cancelled or its lease is lost: stop working on it. */
  signal: AbortSignal;
}

export type Handler = (ctx: TaskContext) => unknown;

export interface WorkerOptions {
  concurrency?: number;
  workerId?: string;
  claimWaitMs?: number;
}

/** Pause before claiming again after a failed claim. */
const CLAIM_RETRY_MS = 500;
/** How often the heartbeat timer looks for leases due a renewal. */
const HEARTBEAT_TICK_MS = 250;

interface Running {
  lease: Lease;
  leaseTimeoutMs: number;
  lastBeat: number;
  abort: AbortController;
}

export class Worker {
  readonly stats = { claimed: 0, succeeded: 0, failed: 0, lost: 0 };
  private readonly running = new Map<string, Running>();
  private readonly concurrency: number;
  private readonly workerId: string;
  private readonly claimWaitMs: number;
  private stopping = false;
  private slotFree: () => void = () => {};

  constructor(
    private readonly client: Client,
    private readonly handlers: Record<string, Handler>,
    options: WorkerOptions = {},
  ) {
    if (Object.keys(handlers).length === 0) throw new Error("a worker needs at least one handler");
    this.concurrency = Math.max(1, options.concurrency ?? 10);
    this.workerId = options.workerId ?? `node-${process.pid}`;
    this.claimWaitMs = options.claimWaitMs ?? 1000;
  }

  /** Stop claiming; `run()` resolves once the running handlers have finished. */
  stop(): void {
    this.stopping = true;
    this.slotFree();
  }

  async run(): Promise<void> {
    const beats = setInterval(() => void this.heartbeat(), HEARTBEAT_TICK_MS);
    const jobs = new Set<Promise<void>>();
    try {
      while (!this.stopping) {
        const free = this.concurrency - this.running.size;
        if (free <= 0) {
          await new Promise<void>((resolve) => (this.slotFree = resolve));
          continue;
        }
        let tasks: Task[];
        try {
          tasks = await this.client.claim(Object.keys(this.handlers), this.workerId, free, this.claimWaitMs);
        } catch {
          await new Promise((resolve) => setTimeout(resolve, CLAIM_RETRY_MS));
          continue;
        }
        for (const task of tasks) {
          this.stats.claimed += 1;
          const job = this.execute(task).finally(() => jobs.delete(job));
          jobs.add(job);
        }
      }
      await Promise.all(jobs);
    } finally {
      clearInterval(beats);
    }
  }

  private async execute(task: Task): Promise<void> {
    const lease: Lease = { taskId: task.id, leaseToken: task.attempt };
    const abort = new AbortController();
    this.running.set(task.id, { lease, leaseTimeoutMs: millisOf(task.leaseTimeout), lastBeat: Date.now(), abort });
    let failure: unknown = undefined;
    let succeeded = false;
    try {
      await this.handlers[task.queue]({ task, data: decodePayload(task), signal: abort.signal });
      succeeded = true;
    } catch (error) {
      failure = error;
    }
    try {
      // A task cancelled or lost meanwhile is no longer ours to complete or fail.
      if (abort.signal.aborted) return;
      if (succeeded) {
        await this.client.complete(lease);
        this.stats.succeeded += 1;
      } else {
        this.stats.failed += 1;
        await this.client.fail(lease, String(failure));
      }
    } catch {
      // The node did not take the ack or the failure: the lease expires and the task runs
      // again, as at-least-once delivery allows.
    } finally {
      this.running.delete(task.id);
      this.slotFree();
    }
  }

  private async heartbeat(): Promise<void> {
    const now = Date.now();
    const due = [...this.running.values()].filter((r) => now - r.lastBeat >= r.leaseTimeoutMs / 3);
    if (due.length === 0) return;
    for (const r of due) r.lastBeat = now; // one renewal in flight per lease
    try {
      const results = await this.client.heartbeat(due.map((r) => r.lease));
      results.forEach((result, i) => {
        if (!result.ok) {
          this.stats.lost += 1;
          due[i].abort.abort(result.error);
        }
      });
    } catch {
      // The node did not answer: the next tick tries again while the lease lasts.
      for (const r of due) r.lastBeat = now - r.leaseTimeoutMs / 3;
    }
  }
}

// End to end against a running node: submit JSON and bytes tasks, run a worker loop until it
// has handled them (and the tasks another client put on `from-python`), print what it saw.
//   node dist/examples/roundtrip.js 127.0.0.1:7070 [tasks already waiting on from-python]

import { Client, TaskState, Worker, type TaskContext } from "../src";

async function main(): Promise<void> {
  const target = process.argv[2] ?? process.env.CHRONOQ_TARGET ?? "127.0.0.1:7070";
  const fromPython = Number(process.argv[3] ?? "0");
  const client = new Client(target);
  const submitted: string[] = [];
  for (let n = 0; n < 5; n++) {
    const { task } = await client.submit("ts-jobs", { payload: { n, text: "héllo ✓ 東京", nested: { list: [n, null, true] } } });
    submitted.push(task.id);
  }
  submitted.push((await client.submit("ts-jobs", { payload: Buffer.from([0, 1, 2]), delayMs: 100 })).task.id);
  // Outlives its lease unless the worker's heartbeats renew it.
  const slow = await client.submit("ts-slow", { payload: { sleepMs: 2500 }, leaseTimeoutMs: 1000, maxAttempts: 1 });
  submitted.push(slow.task.id);
  // Fails its first attempt: the worker reports it, the node retries it after a backoff.
  const flaky = await client.submit("ts-flaky", { payload: { failFirst: true }, maxAttempts: 3 });
  submitted.push(flaky.task.id);

  // Every queue control, on a queue no worker here serves, read back as stored.
  const controlled = await client.submit("ts-controls", {
    delayMs: 3_600_000,
    concurrencyKey: "customer-7",
    uniqueKey: "report-7",
    uniqueForMs: 600_000,
    debounceKey: "sync-7",
    debounceMs: 5_000,
    debounceMaxMs: 60_000,
    labels: { team: "billing", tier: "gold" },
  });
  const stored = await client.get(controlled.task.id);
  const controls = {
    id: stored.id,
    concurrencyKey: stored.concurrencyKey,
    uniqueKey: stored.uniqueKey,
    uniqueUntil: stored.uniqueUntil?.toISOString(),
    debounceKey: stored.debounceKey,
    debounceUntil: stored.debounceUntil?.toISOString(),
    labels: stored.labels,
  };

  const handled: { queue: string; id: string; contentType: string; data: unknown }[] = [];
  const expected = submitted.length + fromPython;
  const seen = (ctx: TaskContext): void => {
    const data = ctx.data instanceof Buffer ? { bytes: [...ctx.data] } : ctx.data;
    handled.push({ queue: ctx.task.queue, id: ctx.task.id, contentType: ctx.task.contentType, data });
    if (handled.length === expected) worker.stop();
  };
  const worker: Worker = new Worker(
    client,
    {
      "ts-jobs": seen,
      "from-python": seen,
      "ts-flaky": (ctx) => {
        if (ctx.task.attempt === 1) throw new Error("first attempt fails on purpose");
        seen(ctx);
      },
      "ts-slow": async (ctx) => {
        await new Promise((resolve) => setTimeout(resolve, (ctx.data as { sleepMs: number }).sleepMs));
        seen(ctx);
      },
    },
    { concurrency: 4, claimWaitMs: 200 },
  );
  await worker.run();

  const states = await Promise.all(submitted.map((id) => client.get(id)));
  const done = states.every((t) => t.state === TaskState.TASK_STATE_SUCCEEDED);
  const slowTask = states[states.length - 2];
  const flakyTask = states[states.length - 1];
  client.close();
  console.log(JSON.stringify({ submitted, handled, done, slowAttempts: slowTask.attempt,
    flakyAttempts: flakyTask.attempt, flakyError: flakyTask.lastError, stats: worker.stats, controls }));
  if (!done || slowTask.attempt !== 1 || flakyTask.attempt !== 2) process.exitCode = 1;
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});

// Labels, filtered listings and bulk operations against a running node: submit labelled
// tasks due later, list them by label, count a cancel (dry run), run some now, cancel the
// rest, and print what each step answered as one JSON line.
//   node dist/examples/bulk.js 127.0.0.1:7070 [namespace]

import { Client, TaskState } from "../src";

async function main(): Promise<void> {
  const target = process.argv[2] ?? process.env.CHRONOQ_TARGET ?? "127.0.0.1:7070";
  const client = new Client(target, { namespace: process.argv[3] ?? "default" });
  for (let i = 0; i < 6; i++) {
    const customer = i < 4 ? "42" : "7";
    await client.submit("ts-bulk", { delayMs: 3_600_000, labels: { customer } });
  }
  const listed = await client.list({ labels: { customer: "42" }, queue: "ts-bulk" });
  const dry = await client.cancelWhere({ labels: { customer: "42" } }, { dryRun: true });
  const ran = await client.runNowWhere({ labels: { customer: "7" } });
  const cancelled = await client.cancelWhere({ labels: { customer: "42" }, state: TaskState.TASK_STATE_SCHEDULED });
  const ready = await client.list({ queue: "ts-bulk", state: TaskState.TASK_STATE_READY });
  console.log(JSON.stringify({
    listed: listed.tasks.map((t) => t.labels),
    dryRun: dry,
    ranNow: ran,
    cancelled,
    ready: ready.tasks.length,
  }));
  client.close();
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

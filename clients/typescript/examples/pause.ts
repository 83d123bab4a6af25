// Pause and resume against a running node: pause a queue, submit a task due now, show that a
// claim gets nothing, resume, claim it, and print what happened as one JSON line.
//   node dist/examples/pause.js 127.0.0.1:7070 [namespace]

import { Client, ChronoqError } from "../src";

async function main(): Promise<void> {
  const target = process.argv[2] ?? process.env.CHRONOQ_TARGET ?? "127.0.0.1:7070";
  const client = new Client(target, { namespace: process.argv[3] ?? "default" });
  const paused = await client.pauseQueue("ts-paused");
  const { task } = await client.submit("ts-paused");
  const whilePaused = await client.claim(["ts-paused"], "ts-worker", 10, 300);
  const resumed = await client.resumeQueue("ts-paused");
  const afterResume = await client.claim(["ts-paused"], "ts-worker", 10, 2000);
  const limited = await client.setQueue("ts-paused", { maxRunningPerKey: 3 });
  let refused = "";
  try {
    await client.setQueue("ts-paused", { maxRunningPerKey: 10_001 });
  } catch (err: unknown) {
    refused = err instanceof ChronoqError ? err.message : String(err);
  }
  console.log(JSON.stringify({
    paused: paused.paused,
    pausedAt: paused.pausedAt !== undefined,
    whilePaused: whilePaused.length,
    resumed: !resumed.queue.paused,
    skipped: resumed.skipped,
    claimed: afterResume.map((t) => t.id).includes(task.id),
    maxRunningPerKey: limited.maxRunningPerKey,
    refused,
  }));
  client.close();
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

// Queue counts against a running node: submit three tasks due now, wait for the owners'
// next count (bounded), and print the queue's counts and how fresh they are as one JSON line.
//   node dist/examples/counts.js 127.0.0.1:7070 [namespace]

import { Client } from "../src";

async function main(): Promise<void> {
  const target = process.argv[2] ?? process.env.CHRONOQ_TARGET ?? "127.0.0.1:7070";
  const client = new Client(target, { namespace: process.argv[3] ?? "default" });
  for (let i = 0; i < 3; i++) await client.submit("ts-counts");
  const submitted = new Date();
  let answer = await client.queueCounts(["ts-counts"]);
  for (let i = 0; i < 200 && !(answer.asOf && answer.asOf > submitted && answer.uncountedPartitions === 0); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    answer = await client.queueCounts(["ts-counts"]);
  }
  const queue = answer.queues[0];
  console.log(JSON.stringify({
    queue: queue?.queue,
    counts: queue?.counts,
    oldestReady: queue?.oldestReadyAt !== undefined,
    fresh: answer.asOf !== undefined && answer.asOf > submitted,
  }));
  client.close();
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

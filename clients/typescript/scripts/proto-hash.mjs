// Prints the SHA-256 of the .proto files the generated code is made from (in the order the
// generate script passes them), so a test can tell cheaply that src/generated is stale.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

const hash = createHash("sha256");
for (const name of ["tasks.proto", "worker.proto"]) {
  hash.update(readFileSync(new URL(`../../../proto/chronoq/v1/${name}`, import.meta.url)));
}
console.log(hash.digest("hex"));

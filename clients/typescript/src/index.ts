export * from "./client";
export * from "./worker";

-- A stored trace context is kept uncompressed (EXTERNAL: out of line when large, never
-- compressed), so that pg_column_size in the task_bytes fragment reads its full size: a
-- compressible context of 4.6 KB read 235 bytes compressed, and a claim of many such tasks
-- could pass the answer budget that the count is there to keep. Catalog only: rows written
-- before keep their form until rewritten.
ALTER TABLE tasks ALTER COLUMN trace_context SET STORAGE EXTERNAL;

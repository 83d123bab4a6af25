-- The W3C trace context a task carries from its submitter to its worker (chronoq.tracecontext):
-- a small JSON object of header names to values, NULL for untraced tasks (the default: no
-- rewrite of existing rows, nothing stored when tracing is off). Read back on claim, kept
-- across retries and requeues.
ALTER TABLE tasks ADD COLUMN trace_context jsonb;

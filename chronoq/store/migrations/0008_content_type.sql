-- What a task's payload holds, as a MIME type ("application/json", ...). NULL is raw bytes
-- ("application/octet-stream"): every row from before, and the default, so the column costs
-- nothing on tasks that do not set it and adding it rewrites no row.
ALTER TABLE tasks ADD COLUMN content_type text;

-- Who fired each task, with which fencing token: lets the chaos checker prove that every
-- owner write the store accepted carried the partition's current token.
ALTER TABLE tasks ADD COLUMN fired_by text;
ALTER TABLE tasks ADD COLUMN fire_token bigint;

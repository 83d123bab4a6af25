-- Why a schedule is paused when the owner paused it: a schedule it could not materialise
-- (a rule or a value no version accepts today) is set aside with the reason, not retried
-- every pass. NULL when a user paused it, or once it is resumed.
ALTER TABLE schedules ADD COLUMN paused_reason text;

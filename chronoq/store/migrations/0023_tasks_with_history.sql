-- Every task row, live or retired into history (migration 0022), for the readers that want
-- finished tasks wherever they are: the chaos checker's end-of-run read, the lab's probes and
-- the benches. A row moving from tasks to task_history moves in one transaction, so one
-- statement over this view sees it exactly once. The columns are tasks' own (not retire_at),
-- listed from the catalog: a migration that adds a column to tasks (and to task_history)
-- drops and creates this view again the same way.
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols
        FROM pg_attribute
        WHERE attrelid = 'tasks'::regclass AND attnum > 0 AND NOT attisdropped;
    EXECUTE format(
        'CREATE VIEW tasks_with_history AS SELECT %s FROM tasks UNION ALL SELECT %s FROM task_history',
        cols, cols);
END
$$;

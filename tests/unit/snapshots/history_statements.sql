-- partitions_catalog

    SELECT parent.relname AS branch, child.relname AS name,
           pg_catalog.pg_get_expr(child.relpartbound, child.oid) AS bound,
           pg_catalog.obj_description(parent.oid, 'pg_class') AS comment
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class parent ON parent.oid = i.inhparent
    JOIN pg_catalog.pg_class child ON child.oid = i.inhrelid
    WHERE i.inhparent IN (to_regclass(%(done)s), to_regclass(%(failed)s))
    ORDER BY 1, 2
    

-- history_lock_wait
SELECT pg_advisory_xact_lock(hashtext(%(key)s))

-- history_lock_try
SELECT pg_try_advisory_xact_lock(hashtext(%(key)s)) AS got

-- lock_timeout
SET LOCAL lock_timeout = '5000ms'

-- now
SELECT now()

-- oldest_finished
SELECT min(finished_at) FROM app.q_jobs_done_default

-- lock_default
LOCK TABLE app.q_jobs_failed_default IN ACCESS EXCLUSIVE MODE

-- create_partition
CREATE TABLE app.q_jobs_done_p2026120300 (LIKE app.q_jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)

-- move_rows
WITH moved AS (DELETE FROM app.q_jobs_done_default WHERE finished_at >= %(lower)s AND finished_at < %(upper)s RETURNING "id", "task", "payload", "priority", "queue_id", "status", "attempts", "max_attempts", "errors", "result", "created_at", "scheduled_at", "finished_at", "unique_key", "about_table", "about_key", "awaited") INSERT INTO app.q_jobs_done_p2026120300 ("id", "task", "payload", "priority", "queue_id", "status", "attempts", "max_attempts", "errors", "result", "created_at", "scheduled_at", "finished_at", "unique_key", "about_table", "about_key", "awaited") SELECT "id", "task", "payload", "priority", "queue_id", "status", "attempts", "max_attempts", "errors", "result", "created_at", "scheduled_at", "finished_at", "unique_key", "about_table", "about_key", "awaited" FROM moved RETURNING 1

-- attach_partition
ALTER TABLE app.q_jobs_done ATTACH PARTITION app.q_jobs_done_p2026120300 FOR VALUES FROM ('2026-12-03T00:00:00+00:00') TO ('2026-12-04T00:00:00+00:00')

-- prune_cutoff
SELECT greatest(now() - make_interval(secs => %(age)s), %(earliest)s::TIMESTAMP WITH TIME ZONE)

-- count_partition
SELECT count(*) FROM app.q_jobs_done_p2026120300

-- free_partition_keys
WITH keys AS (DELETE FROM app.q_unique_keys k USING app.q_jobs_done_p2026120300 j WHERE j.unique_key IS NOT NULL AND k.job_id = j.id RETURNING 1), steps AS (DELETE FROM app.q_job_steps s USING app.q_jobs_done_p2026120300 j WHERE s.job_id = j.id RETURNING 1), signals AS (DELETE FROM app.q_job_signals g USING app.q_jobs_done_p2026120300 j WHERE g.job_id = j.id RETURNING 1) SELECT (SELECT count(*) FROM keys) AS unique_keys, (SELECT count(*) FROM steps) AS job_steps, (SELECT count(*) FROM signals) AS job_signals

-- prune_default
WITH gone AS (DELETE FROM app.q_jobs_done_default WHERE finished_at < %(cutoff)s RETURNING id, unique_key), keys AS (DELETE FROM app.q_unique_keys k USING gone WHERE gone.unique_key IS NOT NULL AND k.job_id = gone.id RETURNING 1), steps AS (DELETE FROM app.q_job_steps s USING gone WHERE s.job_id = gone.id RETURNING 1), signals AS (DELETE FROM app.q_job_signals g USING gone WHERE g.job_id = gone.id RETURNING 1) SELECT (SELECT count(*) FROM keys) AS unique_keys, (SELECT count(*) FROM steps) AS job_steps, (SELECT count(*) FROM signals) AS job_signals, (SELECT count(*) FROM gone) AS jobs

-- detach_partition
ALTER TABLE app.q_jobs_done DETACH PARTITION app.q_jobs_done_p2026120300

-- drop_partition
DROP TABLE app.q_jobs_done_p2026120300

-- structure (day)
CREATE TABLE app.q_jobs_live PARTITION OF app.q_jobs (CONSTRAINT q_jobs_live_pkey PRIMARY KEY (id)) FOR VALUES IN ('queued')
COMMENT ON TABLE app.q_jobs_live IS 'sqla_queue: the queued and running jobs'
CREATE TABLE app.q_jobs_done PARTITION OF app.q_jobs FOR VALUES IN ('succeeded', 'cancelled') PARTITION BY RANGE (finished_at)
COMMENT ON TABLE app.q_jobs_done IS 'sqla_queue: finished jobs, one partition per day'
CREATE TABLE app.q_jobs_done_default PARTITION OF app.q_jobs_done DEFAULT
CREATE INDEX q_jobs_done_id_ix ON app.q_jobs_done (id)
CREATE TABLE app.q_jobs_failed PARTITION OF app.q_jobs FOR VALUES IN ('failed') PARTITION BY RANGE (finished_at)
COMMENT ON TABLE app.q_jobs_failed IS 'sqla_queue: finished jobs, one partition per day'
CREATE TABLE app.q_jobs_failed_default PARTITION OF app.q_jobs_failed DEFAULT
CREATE INDEX q_jobs_failed_id_ix ON app.q_jobs_failed (id)

-- structure (month)
CREATE TABLE app.q_jobs_live PARTITION OF app.q_jobs (CONSTRAINT q_jobs_live_pkey PRIMARY KEY (id)) FOR VALUES IN ('queued')
COMMENT ON TABLE app.q_jobs_live IS 'sqla_queue: the queued and running jobs'
CREATE TABLE app.q_jobs_done PARTITION OF app.q_jobs FOR VALUES IN ('succeeded', 'cancelled') PARTITION BY RANGE (finished_at)
COMMENT ON TABLE app.q_jobs_done IS 'sqla_queue: finished jobs, one partition per month'
CREATE TABLE app.q_jobs_done_default PARTITION OF app.q_jobs_done DEFAULT
CREATE INDEX q_jobs_done_id_ix ON app.q_jobs_done (id)
CREATE TABLE app.q_jobs_failed PARTITION OF app.q_jobs FOR VALUES IN ('failed') PARTITION BY RANGE (finished_at)
COMMENT ON TABLE app.q_jobs_failed IS 'sqla_queue: finished jobs, one partition per month'
CREATE TABLE app.q_jobs_failed_default PARTITION OF app.q_jobs_failed DEFAULT
CREATE INDEX q_jobs_failed_id_ix ON app.q_jobs_failed (id)

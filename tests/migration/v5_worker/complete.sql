WITH o AS MATERIALIZED 
(SELECT r.id AS id, r.attempt AS attempt, r.kind AS kind, r.result AS result, r.error AS error, r.execute_at AS execute_at, r.delay AS delay 
FROM jsonb_to_recordset(CAST(%(outcomes)s::VARCHAR AS JSONB)) AS r(id BIGINT, attempt INTEGER, kind TEXT, result JSONB, error JSONB, execute_at TIMESTAMP WITH TIME ZONE, delay DOUBLE PRECISION)), 
finished AS 
(DELETE FROM work.sqla_queue_job_executions USING o WHERE work.sqla_queue_job_executions.id = o.id AND work.sqla_queue_job_executions.attempt = o.attempt AND work.sqla_queue_job_executions.worker_id = %(worker)s::UUID AND coalesce(work.sqla_queue_job_executions.state, '') = 'running' AND o.kind IN ('succeeded', 'failed', 'cancelled') AND work.sqla_queue_job_executions.queue_id IS NULL RETURNING work.sqla_queue_job_executions.id, work.sqla_queue_job_executions.cancel_requested AS cancel), 
requeued AS 
(UPDATE work.sqla_queue_job_executions SET state=CASE WHEN work.sqla_queue_job_executions.cancel_requested THEN 'done' ELSE 'pending' END, execute_at=coalesce(o.execute_at, now() + coalesce(o.delay, %(coalesce_1)s) * interval '1 second'), attempt=CASE WHEN (o.kind = 'retry') THEN work.sqla_queue_job_executions.attempt ELSE work.sqla_queue_job_executions.attempt - %(attempt_1)s::INTEGER END, worker_id=NULL, alive_at=NULL, slot=NULL FROM o WHERE work.sqla_queue_job_executions.id = o.id AND work.sqla_queue_job_executions.attempt = o.attempt AND work.sqla_queue_job_executions.worker_id = %(worker)s::UUID AND coalesce(work.sqla_queue_job_executions.state, '') = 'running' AND o.kind IN ('retry', 'reschedule', 'release') RETURNING work.sqla_queue_job_executions.id, work.sqla_queue_job_executions.cancel_requested AS cancel), 
parked AS 
(UPDATE work.sqla_queue_job_executions SET state='done', worker_id=NULL, alive_at=NULL, slot=NULL FROM o WHERE work.sqla_queue_job_executions.id = o.id AND work.sqla_queue_job_executions.attempt = o.attempt AND work.sqla_queue_job_executions.worker_id = %(worker)s::UUID AND coalesce(work.sqla_queue_job_executions.state, '') = 'running' AND o.kind IN ('succeeded', 'failed', 'cancelled') AND num_nonnulls(work.sqla_queue_job_executions.queue_id) = %(num_nonnulls_1)s::INTEGER RETURNING work.sqla_queue_job_executions.id, work.sqla_queue_job_executions.cancel_requested AS cancel), 
recorded AS 
(UPDATE work.sqla_queue_jobs SET status=CASE WHEN (o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded') THEN 'cancelled' WHEN (o.kind = 'succeeded') THEN 'succeeded' WHEN (o.kind = 'failed') THEN 'failed' ELSE work.sqla_queue_jobs.status END, attempts=o.attempt, errors=CASE WHEN (o.error IS NULL) THEN work.sqla_queue_jobs.errors ELSE work.sqla_queue_jobs.errors || jsonb_build_array(o.error) END, result=CASE WHEN (o.kind = 'succeeded') THEN o.result ELSE work.sqla_queue_jobs.result END, finished_at=CASE WHEN (o.kind IN ('succeeded', 'failed', 'cancelled') OR o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded') THEN now() ELSE work.sqla_queue_jobs.finished_at END FROM o, (SELECT finished.id AS id, finished.cancel AS cancel 
FROM finished UNION ALL SELECT requeued.id AS id, requeued.cancel AS cancel 
FROM requeued UNION ALL SELECT parked.id AS id, parked.cancel AS cancel 
FROM parked) AS applied WHERE work.sqla_queue_jobs.id = o.id AND work.sqla_queue_jobs.id = applied.id AND work.sqla_queue_jobs.status = 'queued' AND (o.kind IN ('succeeded', 'failed', 'retry', 'cancelled') OR applied.cancel) RETURNING work.sqla_queue_jobs.id, CASE WHEN (work.sqla_queue_jobs.awaited AND (o.kind IN ('succeeded', 'failed', 'cancelled') OR o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded')) THEN pg_notify(%(param_1)s::VARCHAR, CAST(work.sqla_queue_jobs.id AS TEXT)) ELSE NULL END AS notified)
 SELECT finished.id 
FROM finished UNION ALL SELECT requeued.id 
FROM requeued UNION ALL SELECT parked.id 
FROM parked UNION ALL SELECT recorded.id 
FROM recorded 
WHERE false

WITH o AS MATERIALIZED 
(SELECT r.id AS id, r.attempt AS attempt, r.kind AS kind, r.result AS result, r.error AS error, r.execute_at AS execute_at, r.delay AS delay 
FROM jsonb_to_recordset(CAST(%(outcomes)s::VARCHAR AS JSONB)) AS r(id BIGINT, attempt INTEGER, kind TEXT, result JSONB, error JSONB, execute_at TIMESTAMP WITH TIME ZONE, delay DOUBLE PRECISION)), 
finished AS 
(DELETE FROM app.q_job_executions USING o WHERE app.q_job_executions.id = o.id AND app.q_job_executions.attempt = o.attempt AND app.q_job_executions.worker_id = %(worker)s::UUID AND coalesce(app.q_job_executions.state, '') = 'running' AND o.kind IN ('succeeded', 'failed', 'cancelled') AND app.q_job_executions.queue_id IS NULL RETURNING app.q_job_executions.id, app.q_job_executions.cancel_requested AS cancel, app.q_job_executions.workflow), 
requeued AS 
(UPDATE app.q_job_executions SET state=CASE WHEN app.q_job_executions.cancel_requested THEN 'done' ELSE 'pending' END, execute_at=coalesce(o.execute_at, now() + coalesce(o.delay, %(coalesce_1)s) * interval '1 second'), attempt=CASE WHEN (o.kind = 'retry') THEN app.q_job_executions.attempt ELSE app.q_job_executions.attempt - %(attempt_1)s::INTEGER END, worker_id=NULL, alive_at=NULL, slot=NULL FROM o WHERE app.q_job_executions.id = o.id AND app.q_job_executions.attempt = o.attempt AND app.q_job_executions.worker_id = %(worker)s::UUID AND coalesce(app.q_job_executions.state, '') = 'running' AND o.kind IN ('retry', 'reschedule', 'release') RETURNING app.q_job_executions.id, app.q_job_executions.cancel_requested AS cancel, app.q_job_executions.workflow), 
parked AS 
(UPDATE app.q_job_executions SET state='done', worker_id=NULL, alive_at=NULL, slot=NULL FROM o WHERE app.q_job_executions.id = o.id AND app.q_job_executions.attempt = o.attempt AND app.q_job_executions.worker_id = %(worker)s::UUID AND coalesce(app.q_job_executions.state, '') = 'running' AND o.kind IN ('succeeded', 'failed', 'cancelled') AND num_nonnulls(app.q_job_executions.queue_id) = %(num_nonnulls_1)s::INTEGER RETURNING app.q_job_executions.id, app.q_job_executions.cancel_requested AS cancel, app.q_job_executions.workflow), 
erased AS 
(DELETE FROM app.q_jobs USING o, (SELECT finished.id AS id, finished.cancel AS cancel, finished.workflow AS workflow 
FROM finished UNION ALL SELECT requeued.id AS id, requeued.cancel AS cancel, requeued.workflow AS workflow 
FROM requeued UNION ALL SELECT parked.id AS id, parked.cancel AS cancel, parked.workflow AS workflow 
FROM parked) AS applied WHERE app.q_jobs.id = o.id AND app.q_jobs.id = applied.id AND app.q_jobs.status = 'queued' AND o.kind = 'succeeded' AND NOT applied.workflow AND app.q_jobs.awaited IS false AND app.q_jobs.unique_key IS NULL RETURNING app.q_jobs.id), 
recorded AS 
(UPDATE app.q_jobs SET status=CASE WHEN (o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded') THEN 'cancelled' WHEN (o.kind = 'succeeded') THEN 'succeeded' WHEN (o.kind = 'failed') THEN 'failed' ELSE app.q_jobs.status END, attempts=o.attempt, errors=CASE WHEN (o.error IS NULL) THEN app.q_jobs.errors ELSE app.q_jobs.errors || jsonb_build_array(o.error) END, result=CASE WHEN (o.kind = 'succeeded') THEN o.result ELSE app.q_jobs.result END, finished_at=CASE WHEN (o.kind IN ('succeeded', 'failed', 'cancelled') OR o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded') THEN now() ELSE app.q_jobs.finished_at END FROM o, (SELECT finished.id AS id, finished.cancel AS cancel, finished.workflow AS workflow 
FROM finished UNION ALL SELECT requeued.id AS id, requeued.cancel AS cancel, requeued.workflow AS workflow 
FROM requeued UNION ALL SELECT parked.id AS id, parked.cancel AS cancel, parked.workflow AS workflow 
FROM parked) AS applied WHERE app.q_jobs.id = o.id AND app.q_jobs.id = applied.id AND app.q_jobs.status = 'queued' AND (o.kind IN ('succeeded', 'failed', 'retry', 'cancelled') OR applied.cancel) AND NOT (EXISTS (SELECT * 
FROM erased 
WHERE erased.id = app.q_jobs.id)) RETURNING app.q_jobs.id, CASE WHEN (app.q_jobs.awaited AND (o.kind IN ('succeeded', 'failed', 'cancelled') OR o.kind = 'cancelled' OR applied.cancel AND o.kind != 'succeeded')) THEN pg_notify(%(param_1)s::VARCHAR, CAST(app.q_jobs.id AS TEXT)) ELSE NULL END AS notified)
 SELECT finished.id 
FROM finished UNION ALL SELECT requeued.id 
FROM requeued UNION ALL SELECT parked.id 
FROM parked UNION ALL SELECT recorded.id 
FROM recorded 
WHERE false

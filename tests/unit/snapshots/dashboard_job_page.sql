SELECT app.q_jobs.id, app.q_jobs.task, app.q_jobs.status, CASE WHEN (app.q_jobs.status != 'queued') THEN app.q_jobs.status ELSE coalesce((SELECT CASE WHEN (app.q_job_executions.state = 'running') THEN CASE WHEN app.q_job_executions.cancel_requested THEN 'cancelling' ELSE 'running' END WHEN (app.q_job_executions.state = 'pending') THEN CASE WHEN (app.q_job_executions.execute_at > now()) THEN 'scheduled' ELSE 'pending' END ELSE app.q_job_executions.state END AS anon_1 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = app.q_jobs.id), (SELECT app.q_workflow_nodes.state 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.job_id = app.q_jobs.id AND app.q_workflow_nodes.state IN ('blocked', 'held')), 'queued') END AS state, app.q_jobs.attempts, app.q_jobs.max_attempts, app.q_jobs.priority, app.q_jobs.queue_id, app.q_jobs.unique_key, app.q_jobs.about_table, app.q_jobs.about_key, app.q_jobs.created_at, app.q_jobs.scheduled_at, app.q_jobs.finished_at, app.q_jobs.errors[%(errors_1)s::INT] AS last_error, CASE WHEN (app.q_jobs.status = 'queued') THEN (SELECT app.q_job_executions.wait 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = app.q_jobs.id AND app.q_job_executions.state = 'suspended') END AS waits_for, CASE WHEN (app.q_jobs.status = 'queued') THEN (SELECT CASE WHEN (EXTRACT(year FROM app.q_job_executions.execute_at) < 9999) THEN app.q_job_executions.execute_at END AS anon_2 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = app.q_jobs.id AND app.q_job_executions.state = 'suspended') END AS until, CASE WHEN (app.q_jobs.status = 'queued') THEN (SELECT live.attempt 
FROM app.q_job_executions AS live 
WHERE live.id = app.q_jobs.id) END AS live_attempt 
FROM app.q_jobs ORDER BY app.q_jobs.id DESC 
 LIMIT %(limit)s::BIGINT

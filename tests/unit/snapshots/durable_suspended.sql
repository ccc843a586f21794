SELECT app.q_job_executions.id, app.q_job_executions.task, app.q_job_executions.queue_id, app.q_job_executions.wait, app.q_job_executions.execute_at 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'suspended' AND (CAST(%(task)s::VARCHAR AS TEXT) IS NULL OR app.q_job_executions.task = CAST(%(task)s::VARCHAR AS TEXT)) ORDER BY app.q_job_executions.execute_at, app.q_job_executions.id 
 LIMIT %(limit)s::INTEGER

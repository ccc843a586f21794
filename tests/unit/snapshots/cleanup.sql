DELETE FROM app.q_job_executions WHERE app.q_job_executions.id IN (SELECT d.id 
FROM app.q_job_executions AS d 
WHERE d.state = 'done' 
 LIMIT __[POSTCOMPILE_limit] FOR UPDATE OF d SKIP LOCKED) RETURNING app.q_job_executions.queue_id

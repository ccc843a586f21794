WITH gone AS 
(DELETE FROM app.q_job_executions WHERE app.q_job_executions.id IN (SELECT d.id 
FROM app.q_job_executions AS d 
WHERE d.queue_id = ANY (%(keys)s::TEXT[]) AND d.state = 'done' FOR UPDATE OF d SKIP LOCKED) RETURNING app.q_job_executions.id)
 SELECT DISTINCT left_.queue_id 
FROM app.q_job_executions AS left_ 
WHERE left_.queue_id = ANY (%(keys)s::TEXT[]) AND left_.state = 'done' AND (left_.id NOT IN (SELECT gone.id 
FROM gone))

SELECT app.q_job_executions.worker_id, count(*) AS running 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'running' GROUP BY app.q_job_executions.worker_id

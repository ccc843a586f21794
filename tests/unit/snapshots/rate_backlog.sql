SELECT (EXISTS (SELECT * 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = %(rate_task)s::VARCHAR AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NULL AND app.q_job_executions.execute_at <= now())) OR (EXISTS (SELECT * 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = %(rate_task)s::VARCHAR AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NOT NULL AND app.q_job_executions.execute_at <= now())) AS due

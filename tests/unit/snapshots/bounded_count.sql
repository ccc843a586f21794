SELECT (SELECT count(*) AS count_1 
FROM (SELECT 1 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = %(task)s::VARCHAR AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NULL 
 LIMIT %(cap)s::INTEGER) AS anon_1) + (SELECT count(*) AS count_2 
FROM (SELECT 1 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = %(task)s::VARCHAR AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NOT NULL 
 LIMIT %(cap)s::INTEGER) AS anon_2) + (SELECT count(*) AS count_3 
FROM (SELECT 1 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = %(task)s::VARCHAR AND app.q_job_executions.state = 'waiting' 
 LIMIT %(cap)s::INTEGER) AS anon_3) AS pending, current_setting('transaction_isolation') AS isolation

SELECT t.task AS task, (SELECT count(*) AS count_1 
FROM (SELECT 1 AS one 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = t.task AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NULL 
 LIMIT __[POSTCOMPILE_cap]) AS anon_1) + (SELECT count(*) AS count_2 
FROM (SELECT 1 AS one 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = t.task AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NOT NULL 
 LIMIT __[POSTCOMPILE_cap]) AS anon_2) AS pending, (SELECT count(*) AS count_3 
FROM (SELECT 1 AS one 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = t.task AND app.q_job_executions.state = 'running' 
 LIMIT __[POSTCOMPILE_cap]) AS anon_3) AS running, EXTRACT(epoch FROM now() - (SELECT min(fresh.execute_at) AS min_1 
FROM (SELECT app.q_job_executions.execute_at AS execute_at 
FROM app.q_job_executions 
WHERE app.q_job_executions.task = t.task AND app.q_job_executions.state = 'pending' AND app.q_job_executions.slot IS NULL ORDER BY app.q_job_executions.priority DESC, app.q_job_executions.execute_at, app.q_job_executions.id 
 LIMIT __[POSTCOMPILE_cap]) AS fresh 
WHERE fresh.execute_at <= now())) AS oldest_due_age 
FROM unnest(%(tasks)s::TEXT[]) AS t(task)

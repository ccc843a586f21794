SELECT app.q_jobs.id, app.q_jobs.task, app.q_jobs.unique_key 
FROM app.q_jobs 
WHERE app.q_jobs.id = ANY (%(ids)s::BIGINT[]) AND app.q_jobs.status IN ('failed', 'cancelled') AND app.q_jobs.unique_key IS NOT NULL ORDER BY app.q_jobs.id

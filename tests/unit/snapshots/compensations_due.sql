WITH owners AS 
(SELECT DISTINCT app.q_job_steps.job_id AS job_id 
FROM app.q_job_steps JOIN app.q_jobs ON app.q_jobs.id = app.q_job_steps.job_id 
WHERE app.q_job_steps.compensate IS NOT NULL AND app.q_job_steps.compensated_by IS NULL AND app.q_jobs.status IN ('failed', 'cancelled') 
 LIMIT %(limit)s::INTEGER), 
locked AS 
(SELECT app.q_jobs.id AS id 
FROM app.q_jobs 
WHERE app.q_jobs.id IN (SELECT owners.job_id 
FROM owners) AND app.q_jobs.status IN ('failed', 'cancelled') FOR NO KEY UPDATE OF q_jobs SKIP LOCKED)
 SELECT app.q_job_steps.job_id, app.q_job_steps.name, app.q_job_steps.compensate 
FROM app.q_job_steps 
WHERE app.q_job_steps.job_id IN (SELECT locked.id 
FROM locked) AND app.q_job_steps.compensate IS NOT NULL AND app.q_job_steps.compensated_by IS NULL ORDER BY app.q_job_steps.job_id, app.q_job_steps.seq DESC FOR UPDATE OF q_job_steps

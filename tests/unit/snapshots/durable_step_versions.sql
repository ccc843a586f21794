SELECT app.q_jobs.task, app.q_job_steps.name, app.q_job_steps.version, count(*) AS jobs 
FROM app.q_job_steps JOIN app.q_jobs ON app.q_jobs.id = app.q_job_steps.job_id 
WHERE app.q_jobs.status = 'queued' AND app.q_job_steps.kind != %(kind_1)s::VARCHAR GROUP BY app.q_jobs.task, app.q_job_steps.name, app.q_job_steps.version ORDER BY app.q_jobs.task, app.q_job_steps.name, app.q_job_steps.version

SELECT app.q_job_steps.name, app.q_job_steps.kind, app.q_job_steps.version, app.q_job_steps.result, CASE WHEN (app.q_job_steps.kind = %(kind_1)s::VARCHAR) THEN CAST((app.q_job_steps.result ->> %(result_1)s::TEXT) AS TIMESTAMP WITH TIME ZONE) <= now() ELSE NULL END AS elapsed 
FROM app.q_job_steps 
WHERE app.q_job_steps.job_id = %(job)s::BIGINT ORDER BY app.q_job_steps.seq

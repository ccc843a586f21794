SELECT app.q_job_signals.payload 
FROM app.q_job_signals 
WHERE app.q_job_signals.job_id = %(job)s::BIGINT AND app.q_job_signals.name = %(signal)s::VARCHAR

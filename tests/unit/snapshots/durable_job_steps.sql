SELECT app.q_job_steps.name, app.q_job_steps.kind, app.q_job_steps.version, app.q_job_steps.attempt, app.q_job_steps.result, app.q_job_steps.compensated_by, app.q_job_steps.compensate IS NOT NULL AS has_compensation, app.q_job_steps.committed_at 
FROM app.q_job_steps 
WHERE app.q_job_steps.job_id = %(job)s::BIGINT ORDER BY app.q_job_steps.seq

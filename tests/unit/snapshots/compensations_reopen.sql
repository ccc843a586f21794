DELETE FROM app.q_job_steps WHERE app.q_job_steps.job_id = ANY (%(ids)s::BIGINT[]) AND app.q_job_steps.compensated_by IS NOT NULL RETURNING app.q_job_steps.job_id, app.q_job_steps.name

UPDATE app.q_workflows SET cancelled_at=coalesce(app.q_workflows.cancelled_at, now()) WHERE app.q_workflows.id = %(wf)s::BIGINT RETURNING app.q_workflows.id

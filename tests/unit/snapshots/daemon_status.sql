SELECT app.q_daemons.name, app.q_daemons.instance, app.q_daemons.worker_id, app.q_daemons.lease_until, app.q_daemons.started_at, app.q_daemons.restarts, app.q_daemons.last_error, app.q_daemons.worker_id IS NOT NULL AND app.q_daemons.lease_until >= now() AS running 
FROM app.q_daemons ORDER BY app.q_daemons.name, app.q_daemons.instance

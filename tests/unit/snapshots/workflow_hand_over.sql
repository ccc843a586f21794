WITH moved AS 
(DELETE FROM app.q_workflow_edges WHERE app.q_workflow_edges.parent_id = %(expander)s::BIGINT AND app.q_workflow_edges.outcome IS NULL AND app.q_workflow_edges.child_id != ALL (%(fresh)s::BIGINT[]) RETURNING app.q_workflow_edges.child_id), 
added AS 
(INSERT INTO app.q_workflow_edges (child_id, parent_id) SELECT moved.child_id AS child_id, sink.value AS value 
FROM moved JOIN unnest(%(sinks)s::BIGINT[]) AS sink(value) ON true RETURNING app.q_workflow_edges.child_id), 
recounted AS 
(UPDATE app.q_workflow_nodes SET parents=((app.q_workflow_nodes.parents + cardinality(%(sinks)s::BIGINT[])) - %(param_1)s::INTEGER) WHERE app.q_workflow_nodes.job_id IN (SELECT moved.child_id 
FROM moved) RETURNING app.q_workflow_nodes.job_id)
 SELECT recounted.job_id 
FROM recounted
